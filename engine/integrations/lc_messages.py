"""Conversion between histlog messages and ``langchain_core`` messages, lossless both ways for
what both sides have (docs/langchain.md has the full table).

Promises (tests/unit/test_langchain_convert.py checks both with hypothesis):

* ``from_langchain(to_langchain(ms)) == ms`` for every list of valid histlog messages: equal
  canonical bytes, so metadata number spellings, part metadata, reasoning ``state`` bytes and
  tool-call argument text come back exactly.
* ``to_langchain(from_langchain(lcs)) == lcs`` for the LangChain messages accepted here, up to
  three normalisations LangChain itself treats as equal: a plain-string item of a content list
  becomes a text block, a reasoning block without text gets ``""``, and tool-call blocks that
  mark only some of a message's calls are dropped for the ``tool_calls`` order.
* What has no histlog form raises ``ConversionError`` (an ``InvalidMessage``) naming the message
  and the member; nothing is dropped silently. ``RemoveMessage``, ``ChatMessage`` and
  ``FunctionMessage``, ``file_id`` media, and block types histlog has no part for are refused.

How the two sides meet: roles map to the four LangChain types; text, media
(image/audio/video/file blocks), reasoning (provider members kept as JSON in the part's
``state``, byte-exact), refusal blocks; ``AIMessage.tool_calls`` / ``invalid_tool_calls`` are
tool-call parts (``args`` as JSON text; an exact text that differs from LangChain's compact
re-serialisation travels in ``additional_kwargs``); one histlog tool message is one
``ToolMessage`` per result (``tool_call_id``, ``name``, ``status="error"`` = ``is_error``,
``artifact`` = the output's ``details``). Message metadata ``id``, ``name``, ``usage``
(``usage_metadata``), ``response_metadata`` and ``additional_kwargs`` map to those fields when
their JSON round-trips exactly; every other key travels verbatim as JSON text in
``additional_kwargs["histlog_metadata"]`` (part metadata: the block's ``histlog_metadata``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from engine.integrations.lc_blocks import (
    DETAILS,
    EXTRA,
    FORM,
    MISSING,
    PART_META,
    TOOL_CALLS,
    TOOL_GROUP,
    ConversionError,
    bag_in,
    block_part,
    build,
    compact_json,
    exact_value,
    fail,
    fields_out,
    loads_json,
    meta_from,
    part_block,
    to_raw,
)
from schemas.canonical import RawJSON
from schemas.messages import (
    AnyPart,
    MediaPart,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
)

__all__ = ["ConversionError", "from_langchain", "to_langchain"]


# --------------------------------------------------------------------------- tool calls


def _marker(raw: RawJSON | None) -> Any:
    """The ``{"error": ...}`` an invalid tool call leaves in part metadata, or ``MISSING``."""
    value = exact_value(raw) if raw is not None else MISSING
    if isinstance(value, dict) and list(value) == ["error"]:
        error = value["error"]
        if error is None or isinstance(error, str):
            return error
    return MISSING


def _call_out(part: ToolCallPart) -> tuple[dict[str, Any], bool, dict[str, Any]]:
    """A tool-call part as a LangChain tool call (valid: JSON-object args) or invalid tool call,
    with what must travel beside it (exact argument text, part metadata)."""
    meta = dict(part.metadata)
    args = loads_json(part.arguments)
    error = _marker(meta.get(EXTRA))
    if error is not MISSING and (error is not None or isinstance(args, dict)):
        del meta[EXTRA]
    else:
        error = MISSING
    info: dict[str, Any] = {}
    if error is MISSING and isinstance(args, dict):
        call: dict[str, Any] = {"name": part.name, "args": args, "id": part.id, "type": "tool_call"}
        if compact_json(args) != part.arguments:
            info["arguments"] = part.arguments
        valid = True
    else:
        call = {"name": part.name, "args": part.arguments, "id": part.id,
                "error": None if error is MISSING else error, "type": "invalid_tool_call"}
        valid = False
    if meta:
        info["metadata"] = {k: str(v) for k, v in meta.items()}
    return call, valid, info


def _calls_in(msg: AIMessage, infos: object, where: str) -> tuple[dict[str, ToolCallPart], list[str], list[str]]:
    if not isinstance(infos, dict):
        raise fail(where, f"additional_kwargs[{TOOL_CALLS!r}] must be a dict by call id")
    calls: dict[str, ToolCallPart] = {}
    valid: list[str] = []
    invalid: list[str] = []
    for j, tc in enumerate([*msg.tool_calls, *msg.invalid_tool_calls]):
        at = f"{where}.tool_calls[{j}]"
        call_id, name, args = tc.get("id"), tc.get("name"), tc.get("args")
        if not isinstance(call_id, str) or not call_id:
            raise fail(at, "a tool call needs an id (histlog pairs every result with its call by id)")
        if not isinstance(name, str) or not name:
            raise fail(at, "a tool call needs a name")
        if call_id in calls:
            raise fail(at, f"tool call id {call_id!r} is used twice in one message")
        info = infos.get(call_id, {})
        if not isinstance(info, dict):
            raise fail(at, f"{TOOL_CALLS}[{call_id!r}] must be a dict")
        meta = bag_in(info.get("metadata"), at)
        is_valid = j < len(msg.tool_calls)
        if is_valid:
            exact = info.get("arguments")
            if isinstance(exact, str) and loads_json(exact) is not MISSING and loads_json(exact) == args:
                arguments = exact
            else:
                try:
                    arguments = compact_json(args)
                except (ValueError, TypeError) as exc:
                    raise fail(at, f"args are not JSON ({exc})") from None
            if _marker(meta.get(EXTRA)) is not MISSING:
                raise fail(at, f"metadata {EXTRA!r} marks an invalid tool call on a valid one")
            valid.append(call_id)
        else:
            if not isinstance(args, str):
                raise fail(at, "an invalid tool call needs its args as the model's text")
            arguments = args
            error = tc.get("error")
            if error is not None or isinstance(loads_json(args), dict):
                if EXTRA in meta:
                    raise fail(at, f"metadata {EXTRA!r} given twice")
                meta[EXTRA] = RawJSON.of({"error": error})
            invalid.append(call_id)
        calls[call_id] = build(at, ToolCallPart, call_id, name, arguments, metadata=meta)
    unknown = set(infos) - set(calls)
    if unknown:
        raise fail(where, f"{TOOL_CALLS} names call {sorted(unknown)[0]!r}, which the message does not make")
    return calls, valid, invalid


# --------------------------------------------------------------------------- messages


def _plain(part: object) -> bool:
    return isinstance(part, TextPart) and not part.citations and not part.metadata


def _natural(parts: Sequence[AnyPart]) -> str:
    """How a message's content is spelled unless its metadata says otherwise: ``"str"``,
    ``"blocks"`` (a list, tool calls in ``tool_calls``) or ``"ordered"`` (a list with the calls
    in place, needed when a call precedes other content or an invalid call precedes a valid one)."""
    rank = []
    for p in parts:
        if isinstance(p, ToolCallPart):
            rank.append(1 if _call_out(p)[1] else 2)
        else:
            rank.append(0)
    if rank != sorted(rank):
        return "ordered"
    others = [p for p in parts if not isinstance(p, ToolCallPart)]
    has_calls = len(others) < len(parts)
    only = others[0] if len(others) == 1 else None
    if not others or (isinstance(only, TextPart) and _plain(only) and not (has_calls and not only.text)):
        return "str"
    return "blocks"


_KINDS: Final[Mapping[Role, type[BaseMessage]]] = {
    Role.SYSTEM: SystemMessage, Role.USER: HumanMessage, Role.ASSISTANT: AIMessage, Role.TOOL: ToolMessage}


def _message_out(message: Message) -> BaseMessage:
    kind = _KINDS[message.role]
    natural = _natural(message.parts)
    form = exact_value(message.metadata[FORM]) if FORM in message.metadata else MISSING
    has_calls = any(isinstance(p, ToolCallPart) for p in message.parts)
    consumed = (form == "ordered" and has_calls and natural != "ordered") or (form == "blocks" and natural == "str")
    chosen = form if consumed else natural
    content: str | list[str | dict[str, Any]]
    calls, infos = [], {}
    for p in message.parts:
        if isinstance(p, ToolCallPart):
            call, _, info = _call_out(p)
            calls.append(call)
            if info:
                infos[p.id] = info
    if chosen == "str":
        content = next((p.text for p in message.parts if isinstance(p, TextPart)), "")
    elif chosen == "blocks":
        content = [part_block(p) for p in message.parts if not isinstance(p, ToolCallPart)]
    else:
        content = [{k: v for k, v in _call_out(p)[0].items()} if isinstance(p, ToolCallPart) else part_block(p)
                   for p in message.parts]
    fields = fields_out(message.metadata, kind, skip=FORM if consumed else "")
    if kind is AIMessage:
        fields["tool_calls"] = [c for c in calls if c["type"] == "tool_call"]
        fields["invalid_tool_calls"] = [c for c in calls if c["type"] == "invalid_tool_call"]
        if infos:
            fields["additional_kwargs"][TOOL_CALLS] = infos
    return kind(content=content, **fields)


def _tool_form(output: ToolOutput) -> str:
    return "str" if len(output.content) == 1 and _plain(output.content[0]) else "blocks"


def _tool_out(message: Message) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    count = len(message.parts)
    for i, part in enumerate(message.parts):
        assert isinstance(part, ToolResultPart)  # Invariant: a tool message holds tool results only.
        kwargs: dict[str, Any] = {}
        pmeta = dict(part.metadata)
        blocks = _tool_form(part.output) == "str" and exact_value(pmeta[FORM]) == "blocks" if FORM in pmeta else False
        if blocks:
            del pmeta[FORM]
        content: str | list[str | dict[str, Any]]
        if _tool_form(part.output) == "str" and not blocks:
            content = part.output.content[0].text  # type: ignore[union-attr]
        else:
            content = [part_block(c) for c in part.output.content]
        artifact = None
        if part.output.details is not None:
            artifact = part.output.details.value()
            if RawJSON.of(artifact) != part.output.details:
                kwargs[DETAILS] = str(part.output.details)
        if pmeta:
            kwargs[PART_META] = {k: str(v) for k, v in pmeta.items()}
        if count > 1:
            kwargs[TOOL_GROUP] = [i, count]
        fields = fields_out(message.metadata, ToolMessage) if i == 0 else {"additional_kwargs": {}}
        fields["additional_kwargs"].update(kwargs)
        out.append(ToolMessage(content=content, tool_call_id=part.id, name=part.name,
                               status="error" if part.is_error else "success", artifact=artifact, **fields))
    return out


def to_langchain(messages: Iterable[Message]) -> list[BaseMessage]:
    """histlog messages as LangChain messages (a tool message becomes one ``ToolMessage`` per
    result). Lossless: ``from_langchain`` gives the same messages back, byte for byte."""
    out: list[BaseMessage] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Message):
            raise fail(f"messages[{i}]", f"expected a schemas.Message, got {type(message).__name__}")
        if message.role is Role.TOOL:
            out.extend(_tool_out(message))
        else:
            out.append(_message_out(message))
    return out


def _content_in(content: object, where: str) -> list[AnyPart | str]:
    if isinstance(content, str):
        return [TextPart(content)]
    if not isinstance(content, list):
        raise fail(where, f"content must be a str or a list, got {type(content).__name__}")
    return [block_part(b, f"{where}.content[{j}]") for j, b in enumerate(content)]


def _message_in(msg: BaseMessage, role: Role, where: str) -> Message:
    kwargs = dict(msg.additional_kwargs)
    items: list[AnyPart | str]
    placed: set[str] = set()
    calls: dict[str, ToolCallPart] = {}
    valid: list[str] = []
    invalid: list[str] = []
    if isinstance(msg, AIMessage):
        calls, valid, invalid = _calls_in(msg, kwargs.pop(TOOL_CALLS, {}), where)
    items = [] if isinstance(msg.content, str) and not msg.content and calls else _content_in(msg.content, where)
    parts: list[AnyPart] = []
    for j, item in enumerate(items):
        if isinstance(item, str):
            if item not in calls or item in placed or (item in valid) != (msg.content[j]["type"] == "tool_call"):  # type: ignore[index]
                raise fail(f"{where}.content[{j}]", f"tool call block {item!r} matches no tool call of the message, "
                                                      "or one placed already")
            placed.add(item)
            parts.append(calls[item])
        else:
            parts.append(item)
    parts.extend(calls[c] for c in [*valid, *invalid] if c not in placed)
    all_marked = bool(calls) and placed == set(calls)
    actual = "str" if isinstance(msg.content, str) else ("ordered" if all_marked else "blocks")
    meta = meta_from(msg, kwargs, where)
    natural = _natural(parts)
    if actual != natural and not (actual == "blocks" and natural == "ordered"):
        if FORM in meta:
            raise fail(where, f"metadata {FORM!r} given twice")
        meta[FORM] = RawJSON.of(actual)
    return build(where, Message, role, parts, meta)


def _tool_in(group: Sequence[ToolMessage], where: str) -> Message:
    results: list[ToolResultPart] = []
    meta: dict[str, RawJSON] = {}
    for k, tm in enumerate(group):
        at = f"{where}+{k}" if k else where
        kwargs = dict(tm.additional_kwargs)
        kwargs.pop(TOOL_GROUP, None)
        pmeta = bag_in(kwargs.pop(PART_META, None), at)
        exact = kwargs.pop(DETAILS, None)
        items = _content_in(tm.content, at)
        if not all(isinstance(p, (TextPart, MediaPart)) for p in items):
            raise fail(at, "a tool result holds only text and media content")
        if not isinstance(tm.content, str) and len(items) == 1 and _plain(items[0]):  # _tool_form's "str"
            if FORM in pmeta:
                raise fail(at, f"metadata {FORM!r} given twice")
            pmeta[FORM] = RawJSON.of("blocks")
        details = None
        if tm.artifact is not None:
            details = RawJSON(exact) if isinstance(exact, str) and RawJSON(exact).value() == tm.artifact else None
            details = details if details is not None else to_raw(tm.artifact, f"{at}.artifact")
        if not isinstance(tm.name, str) or not tm.name:
            raise fail(at, "a ToolMessage needs the tool's name (histlog tool results name their tool)")
        output = build(at, ToolOutput, tuple(items), details)
        results.append(build(at, ToolResultPart, tm.tool_call_id, tm.name, output,
                              tm.status == "error", metadata=pmeta))
        if k == 0:
            meta = meta_from(tm, kwargs, at)
        elif tm.id is not None or tm.response_metadata or kwargs:
            raise fail(at, "a ToolMessage continuing a split histlog tool message carries message fields")
    return build(where, Message, Role.TOOL, results, meta)


def _group(messages: Sequence[BaseMessage], i: int, where: str) -> int:
    """How many ToolMessages from ``i`` were split from one histlog tool message."""
    mark = messages[i].additional_kwargs.get(TOOL_GROUP)
    if mark is None:
        return 1
    if not (isinstance(mark, list) and len(mark) == 2 and mark[0] == 0 and isinstance(mark[1], int) and mark[1] > 1):
        raise fail(where, f"{TOOL_GROUP} {mark!r} does not start a split tool message")
    count: int = mark[1]
    for k in range(1, count):
        nxt = messages[i + k] if i + k < len(messages) else None
        if not isinstance(nxt, ToolMessage) or nxt.additional_kwargs.get(TOOL_GROUP) != [k, count]:
            raise fail(where, f"{TOOL_GROUP}: ToolMessage {k + 1} of {count} is missing")
    return count


def from_langchain(messages: Iterable[BaseMessage]) -> list[Message]:
    """LangChain messages as histlog messages. Raises ``ConversionError`` for anything histlog
    cannot hold (``RemoveMessage`` among them), before returning anything."""
    lcs = list(messages)
    out: list[Message] = []
    i = 0
    while i < len(lcs):
        msg, where = lcs[i], f"messages[{i}]"
        if isinstance(msg, ToolMessage):
            n = _group(lcs, i, where)
            out.append(_tool_in(lcs[i:i + n], where))  # type: ignore[arg-type]
            i += n
            continue
        if not isinstance(msg, BaseMessage):
            raise fail(where, f"expected a LangChain message, got {type(msg).__name__}")
        if TOOL_GROUP in msg.additional_kwargs:
            raise fail(where, f"{TOOL_GROUP} belongs on ToolMessages only")
        if isinstance(msg, AIMessage):
            out.append(_message_in(msg, Role.ASSISTANT, where))
        elif isinstance(msg, HumanMessage):
            out.append(_message_in(msg, Role.USER, where))
        elif isinstance(msg, SystemMessage):
            out.append(_message_in(msg, Role.SYSTEM, where))
        else:
            raise fail(where, f"{type(msg).__name__} has no histlog form (histlog stores system, user, "
                               "assistant and tool messages; a RemoveMessage edits LangGraph state, not history)")
        i += 1
    return out
