"""The commands that write: ``append``, ``replace-turn``, ``clear``, ``clear-prefix``, ``run begin`` (and
``run show``, beside it), ``turn allocate``, ``assets link``, ``messages delete``. Each builds its input
from the arguments (a ``Batch`` validates before any I/O), makes one engine call and prints the receipt as
the schemas serialise it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from engine.arguments import check_clear_prefix, check_ids
from engine.cli.exits import OK, UsageError
from engine.cli.target import Target
from engine.render import print_lines
from schemas.assets import AssetRef
from schemas.batch import Batch
from schemas.errors import InvalidBatch, InvalidRequest, NotFound
from schemas.ids import ConversationID
from schemas.messages import Message, Role, TextPart, starts_turn
from schemas.runs import Fence
from schemas.slots import TurnSlot

__all__ = ["cmd_append", "cmd_assets_link", "cmd_clear", "cmd_clear_prefix", "cmd_messages_delete", "cmd_replace_turn",
           "cmd_run_begin", "cmd_run_show", "cmd_turn_allocate"]


def _batch_file(conversation: str, append_id: str, path: str) -> Batch:
    """The batch whose messages ``--file`` holds (``Batch.from_messages_json``)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --file {path}: {exc.strerror or exc}") from None
    try:
        return Batch.from_messages_json(conversation, append_id, raw)
    except InvalidBatch as exc:
        raise InvalidBatch(f"--file {path}: {exc}") from None


def cmd_append(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    if ns.file is not None:
        if ns.role is not None:
            raise UsageError("--role goes with --text; a --file gives each message's role")
        batch = _batch_file(ns.conversation, ns.append_id, ns.file)
    else:
        role = ns.role or "user"
        if role not in {r.value for r in Role}:
            raise UsageError(f"unknown role {role!r}: expected one of system, user, assistant, tool")
        if role == "tool":
            raise UsageError("--role tool needs a tool result; use --file with a tool_result part")
        batch = Batch(ns.conversation, ns.append_id, [Message(role, [TextPart(ns.text)])])
    fence = _fence(ns, batch.conversation_id)
    turn = _turn(ns.turn, batch)
    if ns.run is not None:
        batch = Batch(batch.conversation_id, batch.append_id, batch.messages, run_id=ns.run)
    with target.open() as engine:
        receipt = engine.append(batch, fence=fence, turn=turn)
    print_lines(out, receipt.to_json().decode())
    return OK


def _fence(ns: argparse.Namespace, conversation_id: ConversationID) -> Fence | None:
    """``--fence EPOCH --run RUN`` as the write's fence (``histlog run begin`` prints both)."""
    if ns.fence is None:
        return None
    if ns.run is None:
        raise UsageError("--fence needs --run: the run that `histlog run begin` gave that epoch")
    return Fence(conversation_id, ns.run, ns.fence)


def _turn(text: str | None, batch: Batch) -> TurnSlot | None:
    """``--turn TURN_ID:POSITION`` (what `histlog turn allocate` prints) as the append's turn slot."""
    if text is None:
        return None
    turn_id, sep, position = text.rpartition(":")
    if not sep or not turn_id or not position.isascii() or not position.isdigit():
        raise UsageError(f"--turn {text!r}: expected TURN_ID:POSITION, the slot `histlog turn allocate` printed "
                         "(e.g. --turn slot-0190.../0:3)")
    try:
        slot = TurnSlot(batch.conversation_id, turn_id, int(position))
    except InvalidRequest as exc:
        raise UsageError(f"--turn {text!r}: {exc}") from None
    if not any(starts_turn(m) for m in batch.messages):
        raise UsageError("--turn files a turn, and the batch has no user message that opens one: append a user "
                         "message (--role user, the default) or leave --turn out")
    return slot


def cmd_replace_turn(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    if not ns.old_turn_id:
        raise UsageError("OLD_TURN_ID is empty: give the id of the latest turn (see `histlog turns`)")
    if ns.file is not None:
        if ns.answer is not None:
            raise UsageError("--answer goes with --text; a --file holds the whole new turn")
        batch = _batch_file(ns.conversation, ns.append_id, ns.file)
    else:
        answer = [Message.assistant(ns.answer)] if ns.answer is not None else []
        batch = Batch(ns.conversation, ns.append_id, [Message.user(ns.text), *answer])
    with target.open() as engine:
        receipt = engine.replace_turn(batch, ns.old_turn_id, ns.reason)
    print_lines(out, receipt.to_json().decode())
    return OK


def cmd_clear(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    conversation = ConversationID(ns.conversation)
    with target.open() as engine:
        engine.clear(conversation)
    print_lines(out, f"cleared {conversation} (closed forever: later appends to it are refused)")
    return OK


def cmd_clear_prefix(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    prefix = check_clear_prefix(ns.prefix)
    with target.open() as engine:
        cleared = engine.clear_prefix(prefix)
    if ns.json:
        print_lines(out, json.dumps({"cleared": cleared}))
    else:
        print_lines(out, f"cleared {cleared} conversation{'' if cleared == 1 else 's'} whose id starts with "
                         f"{prefix!r} (closed forever: later appends to them are refused)")
    return OK


def cmd_run_begin(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    with target.open() as engine:
        fence = engine.begin_run(ns.conversation, ns.run)
    tree = {"conversation_id": str(fence.conversation_id), "run_id": str(fence.run_id), "epoch": fence.epoch}
    print_lines(out, json.dumps(tree) if ns.json else
                f"run {fence.run_id} owns {fence.conversation_id} from epoch {fence.epoch}: write with "
                f"--run {fence.run_id} --fence {fence.epoch}")
    return OK


def cmd_run_show(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    with target.open() as engine:
        wrote = engine.run_wrote_history(ns.conversation, ns.run, ns.root_turn)
        request: str | None = None
        if ns.root_turn is not None:
            try:
                request = engine.run_request_message(ns.conversation, ns.run, ns.root_turn)
            except NotFound:
                request = None
    if ns.json:
        print_lines(out, json.dumps({"wrote_history": wrote, "request_message_id": request}))
    else:
        print_lines(out, f"wrote history: {'yes' if wrote else 'no'}"
                         + (f"\nrequest: {request or 'none'}" if ns.root_turn is not None else ""))
    return OK


def cmd_turn_allocate(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    with target.open() as engine:
        slot = engine.allocate_turn(ns.conversation)
    tree = {"conversation_id": str(slot.conversation_id), "turn_id": slot.turn_id, "position": slot.position}
    print_lines(out, json.dumps(tree) if ns.json else
                f"turn {slot.turn_id} of {slot.conversation_id} reserved at position {slot.position}: append "
                f"with --turn {slot.turn_id}:{slot.position}")
    return OK


def cmd_assets_link(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    ref = AssetRef(ns.hash, ns.role, ns.ordinal, mime=ns.mime, size_bytes=ns.size, storage_key=ns.storage_key,
                   name=ns.name)  # InvalidRequest naming the field (exit 2) before the engine opens
    with target.open() as engine:
        linked = engine.link_assets(ns.conversation, ns.message_id, [ref])
    print_lines(out, *(json.dumps(a.tree(), sort_keys=True) for a in linked))
    return OK


def cmd_messages_delete(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    conversation = ConversationID(ns.conversation)
    check_ids(ns.ids)  # InvalidWindow (exit 2) before the engine opens
    if ns.run is not None and ns.fence is None:
        raise UsageError("--run goes with --fence: a delete records no run, it is only refused once a later run "
                         "began (give the epoch `histlog run begin` printed)")
    fence = _fence(ns, conversation)
    with target.open() as engine:
        deleted = engine.delete_messages(conversation, ns.ids, fence=fence)
    print_lines(out, json.dumps({"deleted": deleted}) if ns.json else f"deleted {deleted}")
    return OK
