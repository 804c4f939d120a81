"""The fast validation of replayed batches (``schemas/fastpath.py``) against the full model.

Differential: generated valid batches, and mutations of their canonical bytes (wrong types,
out-of-range values, unknown and missing members, written defaults, kinds a role may not carry,
non-canonical key order, whitespace, escapes and number spellings, duplicate keys, bad UTF-8
and lone surrogates, nesting at the depth limit and one past it, random bytes) and of their
events (wrong digest, counts off by one) go through ``event_batch`` twice, fast and full
(``fast=False``): the same verdict (accepted, or the same ``CorruptLog`` reason) and, when
accepted, the same batch: every message equal field by field and type by type, and the same
rows written by the full projection. Structural: the fast path covers every model a message
reaches, and a declaration it does not understand makes its class defer instead of drifting.

``HISTLOG_FAST_EXAMPLES`` (default 150 per test) sets the hypothesis examples; derandomized, so a
run is reproducible.
"""

from __future__ import annotations

import os
import re
from enum import Enum
from typing import Annotated, Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ConfigDict, Field, StrictInt, StrictStr, field_validator

import schemas.fastpath as fastpath
from projections import full
from projections.rows import ConversationRow
from schemas import (
    Batch,
    Citation,
    Media,
    MediaPart,
    Message,
    RawJSON,
    ReasoningPart,
    RefusalPart,
    TextPart,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
)
from schemas.canonical import EMPTY_METADATA, MAX_DEPTH, FrozenDict, _dump_checked, digest_of, loads_exact
from schemas.errors import CorruptLog
from schemas.event_content import event_batch
from schemas.events import BatchAppended, TurnReplaced
from schemas.ids import AppendID, ConversationID
from schemas.messages import ALLOWED_KINDS, Role
from schemas.model import STORED, Model

EXAMPLES = int(os.environ.get("HISTLOG_FAST_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CONV, APPEND = ConversationID("c-1"), AppendID("a-1")

# --------------------------------------------------------------------------- valid batches

_text = st.text(max_size=12)
_name = st.text(min_size=1, max_size=8)
_plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
"""JSON values as Python builds them: orjson spells their numbers, so the fast path must accept."""
_spelled = st.sampled_from(["1e3", "1.50", "-0", "1E+2", "0.10", "18446744073709551616", "-1.0e-7"]).map(RawJSON)
"""Number spellings orjson does not keep: the fast path defers, the full model accepts."""


def _metadata(plain: bool) -> st.SearchStrategy[dict[str, Any]]:
    value = _plain_json if plain else _plain_json | _spelled
    return st.dictionaries(_name, value, max_size=2)


def _media() -> st.SearchStrategy[Media]:
    mime = st.sampled_from(["image/png", "audio/wav", "application/pdf"])
    return st.one_of(
        st.builds(lambda m, d, n: Media(m, d, name=n), mime, st.binary(min_size=1, max_size=6),
                  st.none() | _name),
        st.builds(lambda m, u: Media(m, uri=u), mime, _name),
    )


def _parts(plain: bool) -> dict[str, st.SearchStrategy[Any]]:
    meta = _metadata(plain)
    text = st.builds(lambda t, c, m: TextPart(t, c, metadata=m), _text,
                     st.lists(st.builds(Citation, _name, _text), max_size=2), meta)
    media = st.builds(lambda m, md: MediaPart(m, metadata=md), _media(), meta)
    details = st.none() | (_plain_json if plain else _plain_json | _spelled)
    return {
        "text": text,
        "media": media,
        "reasoning": st.builds(lambda t, s, m: ReasoningPart(t, s, metadata=m), _text, st.binary(max_size=6), meta),
        "tool_call": st.builds(lambda i, n, a, m: ToolCallPart(i, n, a, metadata=m), _name, _name, _text, meta),
        "tool_result": st.builds(
            lambda i, n, c, d, e, m: ToolResultPart(i, n, ToolOutput(c, d), e, metadata=m),
            _name, _name, st.lists(text | media, max_size=2), details, st.booleans(), meta),
        "refusal": st.builds(lambda t, m: RefusalPart(t, metadata=m), _text, meta),
    }


@st.composite
def messages(draw: st.DrawFn, plain: bool = True) -> list[Message]:
    parts = _parts(plain)
    out = []
    for _ in range(draw(st.integers(1, 3))):
        role = draw(st.sampled_from(list(Role)))
        kinds = sorted(ALLOWED_KINDS[role])
        chosen = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3))
        out.append(Message(role, [draw(parts[k]) for k in chosen], draw(_metadata(plain))))
    return out


def _event(data: bytes, count: int, content: int, *, replaced: bool = False,
           digest: str | None = None) -> BatchAppended | TurnReplaced:
    digest = digest_of(data) if digest is None else digest
    if replaced:
        return TurnReplaced(CONV, APPEND, digest, data, count, content, 0, "a-0/0", "edit")
    return BatchAppended(CONV, APPEND, digest, data, count, content, 0, None)


# --------------------------------------------------------------------------- comparing


def _state(value: Any) -> Any:
    """Everything a value holds, by type: what "the same batch" means here."""
    if isinstance(value, Model):
        fields = {k: _state(v) for k, v in value.__dict__.items()}
        out = [type(value).__name__, list(fields), fields, sorted(value.__pydantic_fields_set__),
               value.__pydantic_extra__, value.__pydantic_private__, value.canonical_json()]
        if isinstance(value, Message):
            out += [value.content_bytes(), value.content_json()]
        return out
    if isinstance(value, tuple | list):
        return [type(value).__name__, [_state(v) for v in value]]
    if isinstance(value, FrozenDict):
        return ["FrozenDict", value is EMPTY_METADATA, [(k, _state(v)) for k, v in value.items()]]
    if isinstance(value, Enum):
        return [type(value).__name__, value.value]
    return [type(value).__name__, value]


class _Rows:
    """A write set: what one ``full.append`` puts."""

    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.rows[key] = value

    def get(self, key: bytes) -> bytes | None:
        return self.rows.get(key)


def _rows(batch: Batch) -> dict[bytes, bytes]:
    tx = _Rows()
    full.append(tx, b"c-1", ConversationRow(), batch, 0)  # type: ignore[arg-type]
    return tx.rows


def _verdict(event: BatchAppended | TurnReplaced, fast: bool) -> tuple[str, Batch | None]:
    try:
        return "accepted", event_batch(event, fast=fast)
    except CorruptLog as exc:
        return f"corrupt: {exc.reason}", None


def _same_verdict(event: BatchAppended | TurnReplaced) -> str:
    fast, fast_batch = _verdict(event, fast=True)
    slow, slow_batch = _verdict(event, fast=False)
    assert fast == slow, (event.messages, fast, slow)
    if fast_batch is not None:
        assert slow_batch is not None  # Invariant: same verdict.
        assert fast_batch == slow_batch and fast_batch.canonical_json() == slow_batch.canonical_json()
        assert [_state(m) for m in fast_batch.messages] == [_state(m) for m in slow_batch.messages]
        assert _rows(fast_batch) == _rows(slow_batch)
    return fast


@FUZZ
@given(messages(plain=True), st.booleans())
def test_valid_batches_take_the_fast_path_and_build_the_same_batch(msgs: list[Message], replaced: bool) -> None:
    batch = Batch(CONV, APPEND, msgs)
    data = batch.canonical_json()
    assert fastpath.fast_batch(CONV, APPEND, data) is not None, data  # the common shape is fast
    verdict = _same_verdict(_event(data, len(batch), batch.content_bytes(), replaced=replaced))
    assert verdict == "accepted" or (replaced and msgs[0].role != "user")


@FUZZ
@given(messages(plain=False))
def test_number_spellings_orjson_does_not_keep_defer_and_agree(msgs: list[Message]) -> None:
    batch = Batch(CONV, APPEND, msgs)
    assert _same_verdict(_event(batch.canonical_json(), len(batch), batch.content_bytes())) == "accepted"


# --------------------------------------------------------------------------- invalid batches

_ANY_JSON = _plain_json | st.sampled_from([[], {}, "", 0, -1, True, False, None, "x" * 3])
_KINDS = [*sorted({k for kinds in ALLOWED_KINDS.values() for k in kinds}), "video", ""]
_FIELDS = sorted({name for cls in fastpath.SUPPORTED for name in cls.model_fields} | {"extra"})
_WRITTEN_DEFAULTS = [("is_error", False), ("citations", []), ("metadata", {}), ("text", ""), ("state", ""),
                     ("content", []), ("details", None), ("data", None), ("uri", None), ("name", None),
                     ("state", "AA"), ("state", "AA==\n"), ("data", "AAA="), ("id", ""), ("name", ""),
                     ("uri", ""), ("mime_type", "png"), ("mime_type", " image/png"), ("parts", []),
                     ("role", "bot"), ("role", "User")]


def _dump(tree: Any, sort: bool = True) -> bytes:
    """``tree`` (from ``loads_exact``: numbers keep their spelling) as compact JSON."""
    def prep(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: prep(x) for k, x in v.items()}
        if isinstance(v, list):
            return [prep(x) for x in v]
        if type(v).__name__ == "_Num":
            return orjson.Fragment(v.text)
        return v
    return orjson.dumps(prep(tree), option=orjson.OPT_SORT_KEYS if sort else 0)


def _nodes(tree: Any) -> list[Any]:
    """Every dict and list in ``tree`` (containers a mutation may change)."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            out.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return out


def _nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """The canonical bytes of a valid batch, changed in one of many ways."""
    batch = Batch(CONV, APPEND, draw(messages(plain=draw(st.booleans()))))
    data = batch.canonical_json()
    tree = loads_exact(data)
    objects = [n for n in _nodes(tree) if isinstance(n, dict)]
    members = [n for n in objects if n]  # an empty object (metadata, details) has no member to change
    how = draw(st.integers(0, 13))
    if how == 0:  # a member set to a value of another type or range
        obj = draw(st.sampled_from(members))
        obj[draw(st.sampled_from(sorted(obj)))] = draw(_ANY_JSON)
    elif how == 1:  # a member missing
        obj = draw(st.sampled_from(members))
        del obj[draw(st.sampled_from(sorted(obj)))]
    elif how == 2:  # an unknown member, or a known one where it does not belong
        draw(st.sampled_from(objects))[draw(st.sampled_from(_FIELDS))] = draw(_ANY_JSON)
    elif how == 3:  # a default written, a limit crossed, a member emptied
        field, value = draw(st.sampled_from(_WRITTEN_DEFAULTS))
        draw(st.sampled_from(objects))[field] = value
    elif how == 4:  # a kind the role may not carry, or no such kind
        parts = [o for o in objects if "kind" in o]
        draw(st.sampled_from(parts))["kind"] = draw(st.sampled_from(_KINDS))
    elif how == 5:  # nesting at the limit and one past it, in metadata or details
        target = draw(st.sampled_from(objects))
        depth = MAX_DEPTH + draw(st.sampled_from([-1, 0, 1]))
        if "kind" in target and target["kind"] == "tool_result":
            target["output"]["details"] = _nest(depth)
        else:
            target["metadata"] = {"deep": _nest(depth)}
    elif how == 6:  # keys out of order
        return _dump(tree, sort=False) if draw(st.booleans()) else _dump(_reversed(tree), sort=False)
    elif how == 7:  # whitespace or a random byte somewhere
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from([b" ", b"\n", b"\t", b"\xff", b"\x00", b"\\", b'"', b",", b"}"])) \
            + data[at:]
    elif how == 8:  # another escape for the same text
        text = data.decode()
        choices = [m.start() for m in re.finditer(r'[A-Za-z/\u0080-\uffff]', text)]
        if choices:
            at = draw(st.sampled_from(choices))
            return (text[:at] + f"\\u{ord(text[at]):04x}" + text[at + 1:]).encode()
        return data + b" "
    elif how == 9:  # another spelling of a number
        spots = [m for m in re.finditer(rb"(?<=[:\[,])-?\d+(\.\d+)?([eE][+-]?\d+)?(?=[,\]}])", data)]
        if spots:
            m = draw(st.sampled_from(spots))
            other = draw(st.sampled_from([b"0", b"-0", b"1.0", b"1e3", b"01", b"1.50", m.group() + b"0",
                                          m.group() + b".0", m.group() + b"e0", b"18446744073709551616"]))
            return data[:m.start()] + other + data[m.end():]
        return data + b"\n"
    elif how == 10:  # a duplicate key
        at = draw(st.sampled_from([m.end() for m in re.finditer(rb"\{", data)]))
        dup = draw(st.sampled_from([b'"role":"user",', b'"kind":"text",', b'"text":"x",', b'"zz":1,']))
        return data[:at] + dup + data[at:]
    elif how == 11:  # bad unicode: invalid UTF-8, an encoded surrogate, a lone surrogate escape
        at = draw(st.sampled_from([m.end() for m in re.finditer(rb'"text":"', data)] or [1]))
        bad = draw(st.sampled_from([b"\xc3", b"\xed\xa0\x80", b"\\ud800", b"\\udfff", b"\xf4\x90\x80\x80"]))
        return data[:at] + bad + data[at:]
    elif how == 12:  # truncated, or one bit flipped
        at = draw(st.integers(0, len(data) - 1))
        if draw(st.booleans()):
            return data[:at]
        return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1:]
    else:  # not a batch: empty array, an object, a message alone
        return draw(st.sampled_from([b"[]", b"{}", b"null", data[1:-1], b"[" + data + b"]"]))
    return _dump(tree)


def _reversed(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _reversed(tree[k]) for k in reversed(list(tree))}
    if isinstance(tree, list):
        return [_reversed(v) for v in tree]
    return tree


@FUZZ
@given(mutated(), st.booleans())
def test_mutated_bytes_get_the_same_verdict(data: bytes, replaced: bool) -> None:
    verdict = _same_verdict(_event(data, 1, 0, replaced=replaced))
    if verdict != "accepted":  # mostly poison; the counts given are only right by chance
        assert verdict.startswith("corrupt: ")


@FUZZ
@given(messages(plain=True), st.sampled_from(["digest", "count+1", "count-1", "bytes+1", "bytes-1"]))
def test_wrong_digest_or_counts_are_poison_on_both_paths(msgs: list[Message], wrong: str) -> None:
    batch = Batch(CONV, APPEND, msgs)
    count, size = len(batch), batch.content_bytes()
    count += {"count+1": 1, "count-1": -1}.get(wrong, 0)
    size += {"bytes+1": 1, "bytes-1": -1}.get(wrong, 0)
    digest = digest_of(batch.canonical_json() + b" ") if wrong == "digest" else None
    verdict = _same_verdict(_event(batch.canonical_json(), count, size, digest=digest))
    assert verdict.startswith("corrupt: ")


def test_examples_of_each_class_of_poison_agree() -> None:
    good = Message.tool(ToolResultPart("c1", "f", ToolOutput.text("ok"), metadata={"n": 1})).canonical_json()
    cases = {
        b"[" + good.replace(b'"name":"f"', b'"name":""') + b"]": "corrupt",  # min_length - 1
        b"[" + good.replace(b'"kind":"tool_result"', b'"is_error":false,"kind":"tool_result"') + b"]": "corrupt",
        b"[" + good.replace(b'"n":1', b'"n":1,"n":1') + b"]": "corrupt",  # duplicate key
        b"[" + good.replace(b'"n":1', b'"n":1.0e0') + b"]": "accepted",  # kept spelling: the full model
        b"[" + good.replace(b'"role":"tool"', b'"role":"user"') + b"]": "corrupt",  # kind not allowed
        b"[" + good + b"," + good + b"]": "accepted",
        b"[" + Message.user("stop", metadata={"interrupted": True}).canonical_json() + b"]": "accepted",  # a flag row
        b"[" + good + b"] ": "corrupt",
        b"[ " + good + b"]": "corrupt",
    }
    for data, expected in cases.items():
        tree_ok = expected == "accepted"
        event = _event(data, data.count(b'"role"') if tree_ok else 1,
                       Batch.from_canonical(CONV, APPEND, data).content_bytes() if tree_ok else 0)
        assert _same_verdict(event).split(":")[0] == expected, data


# --------------------------------------------------------------------------- one home per rule


def _models() -> dict[str, type[Model]]:
    out, stack = {}, [Model]
    while stack:
        for sub in stack.pop().__subclasses__():
            out[sub.__name__] = sub
            stack.append(sub)
    return out


@pytest.mark.filterwarnings("ignore::pydantic.json_schema.PydanticJsonSchemaWarning")
def test_every_model_a_message_reaches_is_built_by_the_fast_path() -> None:
    assert fastpath.UNSUPPORTED == {}, "update schemas/fastpath.py for these declarations"
    models = _models()
    reached = set(Message.model_json_schema()["$defs"]) | {"Message"}  # pydantic's own walk of the types
    assert {models[name] for name in reached if name in models} == set(fastpath.SUPPORTED)


@pytest.mark.parametrize("cls", sorted(fastpath.SUPPORTED, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_each_field_of_each_model_is_derived_from_its_declaration(cls: type[Model]) -> None:
    """The builder of ``cls`` knows exactly the declared fields: a value with every field takes
    the fast path, and one with an undeclared member defers."""
    from tests.unit.test_model_fields import SAMPLES

    for sample in SAMPLES[cls]:
        tree = orjson.loads(sample.canonical_json())
        if orjson.dumps(tree, option=orjson.OPT_SORT_KEYS) != sample.canonical_json():
            continue  # a number spelling orjson does not keep: the byte comparison defers it (above)
        built = fastpath._BUILDERS[cls](tree)
        if cls is Message:  # its post-init step takes the bytes written (fast_batch's own last step)
            fastpath._MESSAGE_POST(built, {STORED: _dump_checked(built._fresh_tree(), "")})
        assert built.__dict__.keys() == cls.model_fields.keys()
        assert _state(built) == _state(cls.from_canonical(sample.canonical_json()))
        with pytest.raises(fastpath._Defer):
            fastpath._BUILDERS[cls]({**tree, "undeclared": 1})


class _MaxLen(Model):
    text: Annotated[StrictStr, Field(max_length=3)]


class _Int(Model):
    count: StrictInt


class _Lax(Model):
    text: str


class _Validated(Model):
    text: StrictStr

    @field_validator("text")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()


class _Configured(Model):
    model_config = ConfigDict(frozen=True, extra="ignore", validate_default=False)
    text: StrictStr


@pytest.mark.parametrize("cls", [_MaxLen, _Int, _Lax, _Validated, _Configured], ids=lambda c: c.__name__)
def test_a_declaration_the_fast_path_does_not_know_makes_its_class_defer(cls: type[Model]) -> None:
    with pytest.raises(fastpath._Unsupported):
        fastpath._derive(cls)
