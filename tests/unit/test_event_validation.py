"""The validation of replayed batches (``event_batch``) against an oracle, on generated input.

Generated valid batches, and mutations of their canonical bytes (wrong types, out-of-range
values, unknown and missing members, written defaults, kinds a role may not carry,
non-canonical key order, whitespace, escapes and number spellings, duplicate keys, bad UTF-8 and
lone surrogates, nesting at the depth limit and one past it, random bytes) and of their events
(wrong digest, counts off by one) go through ``event_batch``. The oracle is another route through
the models: the exact parser (``loads_exact``), each message validated from the Python tree
(``Message.model_validate``, not the JSON validator ``event_batch`` reaches first) and the batch's
canonical bytes written again. A record is accepted exactly when the oracle rebuilds its bytes;
when accepted, its batch is the oracle's: every message equal field by field and type by type
(through pydantic's public accessors only), the same digest, the same rows written by the full
projection.

The differential harness of the cost-per-record work (docs/design.md §11): a validator that
yields plain values must give these verdicts. ``HISTLOG_FAST_EXAMPLES`` (default 150 per test)
sets the hypothesis examples; derandomized, so a run is reproducible.
"""

from __future__ import annotations

import os
import re
from enum import Enum
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from schemas.canonical import EMPTY_METADATA, MAX_DEPTH, FrozenDict, digest_of, loads_exact
from schemas.errors import CorruptLog, HistoryError
from schemas.event_content import event_batch
from schemas.events import BatchAppended, TurnReplaced
from schemas.ids import AppendID, ConversationID
from schemas.messages import ALLOWED_KINDS, Role
from schemas.model import Model

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
"""JSON values as Python builds them (orjson spells their numbers)."""
_spelled = st.sampled_from(["1e3", "1.50", "-0", "1E+2", "0.10", "18446744073709551616", "-1.0e-7"]).map(RawJSON)
"""Number spellings orjson does not keep: raw JSON keeps them, and they are accepted."""


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
        # Through pydantic's public accessors only: its private slots change between minor releases.
        out = [type(value).__name__, list(fields), fields, sorted(value.model_fields_set),
               value.model_extra, value.canonical_json()]
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


def _oracle(data: bytes) -> Batch | None:
    """The batch of ``data`` by the exact route, or ``None`` when it is not the canonical JSON of
    valid messages."""
    try:
        tree = loads_exact(data)
        if not isinstance(tree, list) or not tree:
            return None
        batch = Batch(CONV, APPEND, [Message.model_validate(item) for item in tree])
    except (HistoryError, ValueError):
        return None
    return batch if batch.canonical_json() == data else None


def _verdict(event: BatchAppended | TurnReplaced) -> str:
    """``event_batch``'s verdict on ``event``, its batch checked against the oracle's."""
    try:
        batch = event_batch(event)
    except CorruptLog as exc:
        return f"corrupt: {exc.reason}"
    expected = _oracle(event.messages)
    assert expected is not None, event.messages  # accepted: the oracle rebuilds the bytes too
    assert batch.canonical_json() == expected.canonical_json() == event.messages
    assert batch.digest == expected.digest == event.digest
    assert [_state(m) for m in batch.messages] == [_state(m) for m in expected.messages]
    assert _rows(batch) == _rows(expected)
    return "accepted"


@FUZZ
@given(messages(plain=True), st.booleans())
def test_valid_batches_are_accepted_as_the_batch_written(msgs: list[Message], replaced: bool) -> None:
    batch = Batch(CONV, APPEND, msgs)
    data = batch.canonical_json()
    verdict = _verdict(_event(data, len(batch), batch.content_bytes(), replaced=replaced))
    assert verdict == "accepted" or (replaced and msgs[0].role != "user")


@FUZZ
@given(messages(plain=False))
def test_number_spellings_are_kept_and_accepted(msgs: list[Message]) -> None:
    batch = Batch(CONV, APPEND, msgs)
    assert _verdict(_event(batch.canonical_json(), len(batch), batch.content_bytes())) == "accepted"


# --------------------------------------------------------------------------- invalid batches

def _models() -> dict[str, type[Model]]:
    out, stack = {}, [Model]
    while stack:
        for sub in stack.pop().__subclasses__():
            out[sub.__name__] = sub
            stack.append(sub)
    return out


_ANY_JSON = _plain_json | st.sampled_from([[], {}, "", 0, -1, True, False, None, "x" * 3])
_KINDS = [*sorted({k for kinds in ALLOWED_KINDS.values() for k in kinds}), "video", ""]
_FIELDS = sorted({name for cls in _models().values() for name in cls.model_fields} | {"extra"})
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
def test_mutated_bytes_are_accepted_exactly_when_the_oracle_rebuilds_them(data: bytes, replaced: bool) -> None:
    expected = _oracle(data)
    count, size = (len(expected), expected.content_bytes()) if expected is not None else (1, 0)
    verdict = _verdict(_event(data, count, size, replaced=replaced))
    if expected is None:
        assert verdict.startswith("corrupt: messages are not canonical valid messages"), (data, verdict)
    elif not replaced:
        assert verdict == "accepted"
    else:  # a replacement turn must also start with its user message
        assert verdict == "accepted" or verdict.startswith("corrupt: a replacement turn")


@FUZZ
@given(messages(plain=True), st.sampled_from(["digest", "count+1", "count-1", "bytes+1", "bytes-1"]))
def test_wrong_digest_or_counts_are_poison(msgs: list[Message], wrong: str) -> None:
    batch = Batch(CONV, APPEND, msgs)
    count, size = len(batch), batch.content_bytes()
    count += {"count+1": 1, "count-1": -1}.get(wrong, 0)
    size += {"bytes+1": 1, "bytes-1": -1}.get(wrong, 0)
    digest = digest_of(batch.canonical_json() + b" ") if wrong == "digest" else None
    verdict = _verdict(_event(batch.canonical_json(), count, size, digest=digest))
    assert verdict.startswith("corrupt: ")


def test_examples_of_each_class_of_poison() -> None:
    good = Message.tool(ToolResultPart("c1", "f", ToolOutput.text("ok"), metadata={"n": 1})).canonical_json()
    cases = {
        b"[" + good.replace(b'"name":"f"', b'"name":""') + b"]": "corrupt",  # min_length - 1
        b"[" + good.replace(b'"kind":"tool_result"', b'"is_error":false,"kind":"tool_result"') + b"]": "corrupt",
        b"[" + good.replace(b'"n":1', b'"n":1,"n":1') + b"]": "corrupt",  # duplicate key
        b"[" + good.replace(b'"n":1', b'"n":1.0e0') + b"]": "accepted",  # a kept number spelling
        b"[" + good.replace(b'"n":1', b'"n":1e999') + b"]": "corrupt",  # no double holds it
        b"[" + good.replace(b'"n":1', b'"n":' + b"9" * 309) + b"]": "corrupt",
        b"[" + good.replace(b'"n":1', b'"n":-' + b"9" * 308) + b"]": "accepted",  # a double holds it
        b"[" + good.replace(b'"n":1', b'"n":1e-999') + b"]": "accepted",  # finite (0.0 as a double)
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
        assert _verdict(event).split(":")[0] == expected, data
