"""RawJSON and the canonical writer; golden bytes of the log format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import Batch, InvalidMessage, Message, RawJSON, digest_of

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "canonical_batches.json"
BREAKING = (
    "changing these bytes is a BREAKING CHANGE of the log format: stored digests would stop "
    "matching; only update tests/data/golden with a format version bump"
)


def test_rawjson_is_canonical_and_keeps_number_spellings() -> None:
    assert RawJSON('{ "b": 1e3, "a": [1.50] }') == '{"a":[1.50],"b":1e3}'
    assert RawJSON(" -0 ") == "-0"
    assert RawJSON('"\\u00e9\\/"') == '"é/"'
    assert RawJSON("123456789012345678901234567890") == "123456789012345678901234567890"
    assert RawJSON(b"[true,false,null]") == "[true,false,null]"
    assert RawJSON(RawJSON("1")) == "1"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "{",
        "NaN",
        "[Infinity]",
        "-Infinity",
        '{"a":1,"a":2}',
        '"\\ud800"',
        '"\ud800"',
        "01",
        "[1,]",
        "'x'",
        "1 2",
        b"\xff",
    ],
)
def test_rawjson_rejects(bad: str | bytes) -> None:
    with pytest.raises(InvalidMessage):
        RawJSON(bad)


def test_rawjson_of() -> None:
    assert RawJSON.of({"b": [1, 2.5, True, None], "a": "x"}) == '{"a":"x","b":[1,2.5,true,null]}'
    assert RawJSON.of(2**80) == str(2**80)
    assert RawJSON.of((1, RawJSON("1E3"))) == "[1,1E3]"
    for bad in [float("nan"), float("-inf"), {1: 2}, {1, 2}, b"x", "\ud800"]:
        with pytest.raises(InvalidMessage):
            RawJSON.of(bad)


def test_escaping_is_rfc8785() -> None:
    text = "".join(chr(c) for c in range(0x20)) + '"\\/\x7f\x80\u2028é😀'
    got = RawJSON.of(text).encode("utf-8")
    expected = (
        b'"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f'
        b"\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c"
        b'\\u001d\\u001e\\u001f\\"\\\\/' + "\x7f\x80\u2028é😀".encode() + b'"'
    )
    assert got == expected


def test_keys_sorted_by_code_point_not_utf16() -> None:
    # U+E000 < U+1F600 by code point; UTF-16 (RFC 8785) would order the surrogate pair first.
    assert RawJSON.of({"😀": 1, "\ue000": 2, "a": 3, "B": 4}) == '{"B":4,"a":3,"\ue000":2,"😀":1}'


def test_digest_of() -> None:
    assert digest_of(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _golden() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))["cases"]
    return cases


@pytest.mark.parametrize("case", _golden(), ids=lambda c: c["name"])
def test_golden_bytes(case: dict[str, Any]) -> None:
    batch = Batch.from_json(case["input"])
    expected = bytes.fromhex(case["canonical_hex"])
    assert expected == case["canonical"].encode("utf-8"), "golden file is inconsistent"
    assert batch.canonical_json() == expected, f"{case['name']}: {BREAKING}"
    assert batch.digest == case["digest"] == digest_of(expected), f"{case['name']}: {BREAKING}"
    rebuilt = Batch.from_canonical(batch.conversation_id, batch.append_id, expected)
    assert rebuilt.digest == case["digest"]


def test_golden_matches_python_construction() -> None:
    from schemas import ToolCallPart, ToolOutput, ToolResultPart

    by_name = {c["name"]: c for c in _golden()}
    built = Batch(
        "conv-1",
        "a-3",
        [
            Message.tool(
                ToolResultPart(
                    "call_1", "get_weather", ToolOutput.text("1000 mm of rain", details=RawJSON("1e3"))
                )
            )
        ],
    )
    assert built.digest == by_name["tool_result_details_1e3"]["digest"], BREAKING
    call = Batch(
        "conv-1",
        "a-2",
        [Message.assistant(ToolCallPart("call_1", "get_weather", 'city=Oslo, unit: "C" {not json'))],
    )
    assert call.digest == by_name["tool_call_non_json_arguments"]["digest"], BREAKING


def test_docs_worked_example_is_the_text_golden_case() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "canonical-json.md").read_text(encoding="utf-8")
    case = {c["name"]: c for c in _golden()}["text"]
    assert case["canonical"] in doc and case["digest"] in doc


# ----- properties


def _values(scalars: Any) -> Any:
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(alphabet=st.characters(codec="utf-8"), max_size=5), inner, max_size=4)
        ),
        max_leaves=12,
    )


# Without floats: json.dumps (used to make a "loose" spelling) re-spells floats, and RawJSON keeps spellings.
exact_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
)
exact_values = _values(exact_scalars)
json_values = _values(exact_scalars | st.floats(allow_nan=False, allow_infinity=False))


@given(exact_values, st.randoms(use_true_random=False), st.sampled_from(["", " ", "\n  ", "\t"]))
def test_canonical_invariant_under_key_order_and_whitespace(value: Any, rnd: Any, ws: str) -> None:
    def shuffled(v: Any) -> Any:
        if isinstance(v, dict):
            items = list(v.items())
            rnd.shuffle(items)
            return {k: shuffled(x) for k, x in items}
        if isinstance(v, list):
            return [shuffled(x) for x in v]
        return v

    canonical = RawJSON.of(value)
    indent = {"indent": len(ws)} if ws.strip(" ") == "" and ws else {}
    loose = json.dumps(shuffled(json.loads(canonical)), ensure_ascii=bool(rnd.getrandbits(1)), **indent)
    assert RawJSON(loose) == canonical
    assert RawJSON(canonical) == canonical
    assert canonical.value() == json.loads(json.dumps(value))


@given(json_values)
def test_metadata_canonical_bytes_independent_of_input_order(value: Any) -> None:
    meta = {"a": value, "z": 1, "m": [value]}
    reverse = dict(reversed(list(meta.items())))
    assert (
        Message.user("x", metadata=meta).canonical_json()
        == Message.user("x", metadata=reverse).canonical_json()
    )
