"""The ``histlog`` argument parser: every command, its flags and its help text (docs/cli.md has
one section per command). Usage errors become ``UsageError`` (exit 2, one line), never argparse's
own exit. Each command's handler lives in its group's module: ``writes``, ``reads``, ``ops``,
``tools``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

from engine.cli.cluster import cmd_cluster
from engine.cli.exits import UsageError
from engine.cli.keys import cmd_keygen, cmd_keys_rotate
from engine.cli.ops import cmd_rebuild, cmd_stats, cmd_tail
from engine.cli.reads import cmd_list, cmd_locate, cmd_read, cmd_turns
from engine.cli.target import DEFAULT_DATA, DEFAULT_TOPIC, Target
from engine.cli.tools import cmd_bench, cmd_demo, cmd_log_verify, cmd_replay
from engine.cli.writes import (
    cmd_append,
    cmd_assets_link,
    cmd_clear,
    cmd_clear_prefix,
    cmd_messages_delete,
    cmd_replace_turn,
    cmd_run_begin,
    cmd_run_show,
    cmd_turn_allocate,
)

SERVER_MISSING: str | None = None
"""Why ``histlog serve`` cannot run here (histlog[server] is not installed), or None. Every other
command runs without the extra; ``engine.cli.app`` says this line for ``serve`` with any flags."""

try:
    from engine.cli.serve import add_serve, cmd_serve
except ImportError as _missing:
    SERVER_MISSING = f"histlog serve needs the server extra ({_missing}): pip install 'histlog[server]'"

    def add_serve(command: argparse.ArgumentParser, integer: type[int] | object) -> None:
        """Without the extra: no flags to offer (``SERVER_MISSING`` says what to install)."""

    def cmd_serve(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
        raise UsageError(str(SERVER_MISSING))

__all__ = ["build_parser", "subcommands"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (``UsageError``) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _global_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("where the history lives (also accepted before the command)")
    group.add_argument("--data", metavar="DIR", default=argparse.SUPPRESS,
                       help=f"embedded data dir: file log + state (env HISTLOG_DATA, default {DEFAULT_DATA})")
    group.add_argument("--kafka", metavar="HOST:PORT", default=argparse.SUPPRESS,
                       help="use Apache Kafka instead (env HISTLOG_KAFKA)")
    group.add_argument("--topic", metavar="T", default=argparse.SUPPRESS,
                       help=f"Kafka topic (env HISTLOG_TOPIC, default {DEFAULT_TOPIC})")
    group.add_argument("--state", metavar="DIR", default=argparse.SUPPRESS,
                       help="this instance's state dir with --kafka (env HISTLOG_STATE)")
    group.add_argument("--url", metavar="URL", default=argparse.SUPPRESS,
                       help="talk to a histlog server instead, e.g. http://127.0.0.1:8420 (env HISTLOG_URL; "
                            "its bearer token from env HISTLOG_TOKEN; env HISTLOG_TIMEOUT: the seconds a call may "
                            "retry, default 30)")


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``histlog`` argument parser (docs/cli.md has one section per subcommand)."""
    parser = _Parser(
        prog="histlog",
        description="Event-sourced conversation history: an append-only log and its projections.",
        epilog="exit codes: 0 ok, 1 other failure, 2 bad input, 3 conflict or closed, 4 backend unavailable. "
               "HISTLOG_DEBUG=1 shows tracebacks of unexpected errors.",
    )
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, required=True)

    def command(name: str, handler: Callable[..., int] | None, help_: str, description: str = "",
                into: Any = sub) -> argparse.ArgumentParser:
        """A subcommand with the global options; ``handler`` runs it (None: it has subcommands)."""
        p: argparse.ArgumentParser = into.add_parser(name, help=help_, description=description or help_)
        _global_options(p)
        if handler is not None:
            p.set_defaults(handler=handler)
        return p

    command("demo", cmd_demo, "run a scripted support-bot conversation and show what histlog does",
            "Run a scripted multi-turn support-bot conversation (with tool calls) on the embedded default: "
            "appends and receipts, an idempotent retry, a conflict, a window, a clear, stats and a rebuild "
            "from the log. It uses a fresh temporary directory (deleted at exit) unless --data DIR is "
            "given on the command line (HISTLOG_DATA is ignored here, so a demo never writes into your "
            "history by accident). With --kafka HOST:PORT [--topic T] [--state DIR] on the command line "
            "it runs against Kafka (state in a temporary directory unless --state is given). "
            "Exits non-zero if the rebuilt state differs.")

    p = command("append", cmd_append, "append one batch atomically and print its receipt as JSON",
                "Append one batch atomically and idempotently; prints the receipt as one JSON line. "
                'A --file holds a JSON list of messages or {"messages": [...]} (the message JSON of '
                "docs/cli.md). Re-running the same append prints the same receipt.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("append_id", metavar="APPEND_ID")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", metavar="TEXT", help="one message with this text")
    what.add_argument("--file", metavar="BATCH.json", help='a JSON list of messages, or {"messages": [...]}')
    p.add_argument("--role", metavar="ROLE",
                   help="role of the --text message: user (default), assistant, system")
    p.add_argument("--run", metavar="RUN", help="the run that writes the batch (traceability: `histlog run show`)")
    p.add_argument("--fence", metavar="EPOCH", type=_integer,
                   help="with --run: the run's epoch from `histlog run begin`; refused (exit 3) once a later "
                        "run of the conversation began")
    p.add_argument("--turn", metavar="TURN_ID:POSITION",
                   help="file the batch's user-led turn under this slot from `histlog turn allocate`; refused "
                        "(exit 3) when the slot was used, or a later turn was filed first")

    p = command("read", cmd_read, "print a conversation, or a window of it",
                "Print a conversation: one line per message, [TURN:SEQ] role: text. "
                "--json prints a JSON array of entries (position, id, append_id, created_at, message); "
                "with --window, a JSON array of messages; with --max-bytes, "
                '{"entries": [...], "truncated": bool}; with --turn-sources, {"sources": [...], "truncated": bool}; '
                'with --measure, {"messages", "content_bytes", "turns"}.')
    p.add_argument("conversation", metavar="CONVERSATION")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--window", metavar="N", type=_integer,
                     help="only the newest whole turns within N messages (system messages merged first)")
    how.add_argument("--max-bytes", metavar="B", type=_integer,
                     help="only the newest units within a budget of B content bytes")
    how.add_argument("--measure", action="store_true",
                     help="print the messages, content bytes and turns after --after (no payload is read)")
    p.add_argument("--turn-sources", action="store_true",
                   help="with --max-bytes: print only id, role, content, created_at, interrupted of each message")
    p.add_argument("--unit", choices=("turn", "message"), help="with --max-bytes: keep whole turns (default) "
                   "or single messages")
    p.add_argument("--after", metavar="TURN:SEQ", help="only messages after this position (exclusive)")
    p.add_argument("--before", metavar="TURN:SEQ", help="only messages before this position (exclusive; with "
                   "--order desc: the page before the one whose last line has this position)")
    p.add_argument("--order", choices=("asc", "desc"), help="asc: oldest first (default); desc: newest first, so "
                   "--limit keeps the newest")
    p.add_argument("--limit", metavar="N", type=_integer, help="at most N messages")
    p.add_argument("--since", metavar="ISO", help="only messages created at or after this time (ISO 8601; "
                   "UTC when it has no zone)")
    p.add_argument("--until", metavar="ISO", help="only messages created before this time (exclusive)")
    p.add_argument("--include-hidden", action="store_true",
                   help="also the messages of replaced turns, marked hidden (not with --window/--max-bytes/--measure)")
    p.add_argument("--id", metavar="MESSAGE_ID", action="append", dest="ids",
                   help="only the visible messages with these ids (repeat it; APPEND_ID/INDEX as --json shows them; "
                   "ids naming none are left out); with --turn-sources, as turn sources")
    p.add_argument("--json", action="store_true", help="JSON output")

    p = command("locate", cmd_locate, "find the message a platform refers to by its own id",
                "Print the newest visible message of CONVERSATION whose metadata external_id is EXTERNAL_ID "
                "(a platform's own message id: Telegram, Slack, WhatsApp), with up to --context N visible "
                "messages before and after it, marked with >. --json prints {\"message\", \"before\", "
                "\"after\"}. Exits 2 when no visible message has that id.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("external_id", metavar="EXTERNAL_ID")
    p.add_argument("--context", metavar="N", type=_integer, default=0,
                   help="also up to N visible messages before and N after it")
    p.add_argument("--json", action="store_true", help="JSON output")

    p = command("turns", cmd_turns, "list a conversation's visible turns",
                "List the visible user-led turns of a conversation: [POSITION] TURN_ID, its message count "
                "and the id of its answer; the latest one is marked (only it can be replaced). --json "
                "prints an array of {id, position, request_message_id, assistant_message_id, messages}.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("--json", action="store_true", help="JSON output")

    p = command("replace-turn", cmd_replace_turn, "edit or retry the latest turn; print the receipt",
                "Replace the latest visible turn OLD_TURN_ID (see `histlog turns`) by a new turn, as one "
                "atomic event: --reason retry keeps the user message (same text) with a new answer, "
                "--reason edit changes the user message. The old turn is hidden from every read but kept "
                "in the log (`histlog read --include-hidden`). Exits 3 if OLD_TURN_ID is no longer the "
                "latest visible turn.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("old_turn_id", metavar="OLD_TURN_ID")
    p.add_argument("append_id", metavar="APPEND_ID")
    p.add_argument("--reason", choices=("edit", "retry"), required=True, help="edit or retry")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", metavar="TEXT", help="the new turn's user message")
    what.add_argument("--file", metavar="TURN.json", help='the whole new turn: a JSON list of messages, '
                      'or {"messages": [...]}, starting with the user message')
    p.add_argument("--answer", metavar="TEXT", help="with --text: the new turn's assistant answer")

    p = command("list", cmd_list, "list open conversations in lexical order")
    p.add_argument("--prefix", metavar="P", help="only ids starting with P (e.g. bot-7/ for one bot's "
                   "conversations, with such an id convention)")
    p.add_argument("--after", metavar="ID", help="only ids after this one (exclusive: the last id of a page)")
    p.add_argument("--limit", metavar="N", type=_integer, help="at most N ids")
    p.add_argument("--json", action="store_true", help="a JSON array of ids")

    p = command("clear", cmd_clear, "close a conversation forever (idempotent)",
                "Close a conversation forever: its messages leave the projections and later appends are "
                "refused (exit 3). Clearing twice, or clearing an id never written, is fine.")
    p.add_argument("conversation", metavar="CONVERSATION")

    p = command("clear-prefix", cmd_clear_prefix, "clear every open conversation whose id starts with PREFIX",
                "Clear every open conversation whose id starts with PREFIX (e.g. bot-7/ for one bot's, with "
                "such an id convention), each erased as `histlog clear` erases it; prints how many. A "
                "conversation created while it runs is not touched. Idempotent and resumable: after a "
                "failure, run it again to clear the rest. An empty PREFIX is refused (exit 2).")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument("--json", action="store_true", help='print {"cleared": N}')

    p = command("run", None, "runs and their fences (run begin, run show)")
    run_sub = p.add_subparsers(dest="run_command", metavar="RUN_COMMAND", parser_class=_Parser, required=True)
    p = command("begin", cmd_run_begin, "the run now owns the conversation's writes: print its fence",
                "Record that RUN now owns CONVERSATION's writes and print its fence: the epoch that "
                "`histlog append --run RUN --fence EPOCH` writes under. A later run's begin fences it "
                "(its writes exit 3). The same run again prints its own epoch.", into=run_sub)
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--json", action="store_true", help='print {"conversation_id", "run_id", "epoch"}')
    p = command("show", cmd_run_show, "whether a run wrote history, and its applied request",
                "Print whether RUN wrote any message of CONVERSATION (hidden ones too) and, with "
                "--root-turn, in that turn, with the run's applied request (else the root turn's).", into=run_sub)
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--root-turn", metavar="TURN_ID", help="a turn id (see `histlog turns`)")
    p.add_argument("--json", action="store_true", help='print {"wrote_history", "request_message_id"}')

    p = command("turn", None, "turn slots (turn allocate)")
    turn_sub = p.add_subparsers(dest="turn_command", metavar="TURN_COMMAND", parser_class=_Parser, required=True)
    p = command("allocate", cmd_turn_allocate, "reserve the conversation's next turn: print its slot",
                "Reserve CONVERSATION's next turn before any of its messages exist and print the slot: its "
                "turn id and position, which `histlog append --turn TURN_ID:POSITION` files a turn under. "
                "A slot is spent whether or not it is used; using it twice, or after a later turn, exits 3.",
                into=turn_sub)
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("--json", action="store_true", help='print {"conversation_id", "turn_id", "position"}')

    p = command("assets", None, "media references on messages (assets link)")
    assets_sub = p.add_subparsers(dest="assets_command", metavar="ASSETS_COMMAND", parser_class=_Parser,
                                  required=True)
    p = command("link", cmd_assets_link, "link a media reference to a visible message; print its assets",
                "Link one media reference (content-addressed: --hash is the file's sha256:) to the visible "
                "message MESSAGE_ID (APPEND_ID/INDEX) of CONVERSATION and print all its assets, one JSON object "
                "a line. The same reference again changes nothing; another one at a linked --ordinal exits 3.",
                into=assets_sub)
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("message_id", metavar="MESSAGE_ID")
    p.add_argument("--hash", required=True, metavar="sha256:HEX", help="the media file's sha256: and 64 hex digits")
    p.add_argument("--role", required=True, help="what the media is to the message (image, attachment, ...)")
    p.add_argument("--ordinal", type=_integer, default=0, help="its place among the message's assets (default 0)")
    p.add_argument("--mime", help="its media type")
    p.add_argument("--size", type=_integer, help="its size in bytes")
    p.add_argument("--storage-key", help="where it is stored (an object key)")
    p.add_argument("--name", help="its file name")

    p = command("messages", None, "single messages (messages delete)")
    messages_sub = p.add_subparsers(dest="messages_command", metavar="MESSAGES_COMMAND", parser_class=_Parser,
                                    required=True)
    p = command("delete", cmd_messages_delete, "delete visible messages from every read; print how many",
                "Delete the visible messages MESSAGE_ID... (APPEND_ID/INDEX, as `histlog read --json` shows them, "
                "at most 10,000) of CONVERSATION from every read and print how many were deleted: `deleted N`. "
                "Ids that name no visible message (unknown, hidden by a replacement, already deleted, not a "
                "message id) change nothing and are not counted, so running it again is safe (it prints "
                "`deleted 0`). A cleared conversation, or --fence of a run a later run superseded, exits 3.",
                into=messages_sub)
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("ids", nargs="+", metavar="MESSAGE_ID")
    p.add_argument("--run", metavar="RUN", help="with --fence: the run that `histlog run begin` gave that epoch")
    p.add_argument("--fence", metavar="EPOCH", type=_integer,
                   help="with --run: the run's epoch from `histlog run begin`; refused (exit 3) once a later "
                        "run of the conversation began")
    p.add_argument("--json", action="store_true", help='print {"deleted": N}')

    p = command("stats", cmd_stats, "log offsets, lag and admission counts")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = command("tail", cmd_tail, "follow accepted messages as they are applied",
                "Follow new accepted messages (and clears) as this instance applies them, one line each, "
                "until Ctrl-C or SIGTERM. --no-follow prints the last --lines records of the log and exits. "
                "The embedded log has one writer process, so following it is for a data dir nobody else "
                "holds; with Kafka, tail any number of instances.")
    p.add_argument("--no-follow", dest="follow", action="store_false",
                   help="print the last records of the log and exit")
    p.add_argument("-n", "--lines", metavar="N", type=_integer, default=10,
                   help="with --no-follow: how many records (default 10)")

    p = command("rebuild", cmd_rebuild, "rebuild the state from the log, with a progress bar",
                "Delete the state (DATA/state, or --state with Kafka) and replay the log into a new one, with a "
                "progress bar on stderr; prints the records replayed and the rate. Nothing else may use the "
                "data dir meanwhile. A damaged state is replaced without being read. A state that has applied "
                "records a durable log no longer holds is evidence of lost acknowledged data: rebuild refuses "
                "(exit 1, the state is kept) unless --accept-log-loss, which names what is lost and rebuilds "
                "from what the log still holds.")
    p.add_argument("--accept-log-loss", action="store_true",
                   help="rebuild even though the log lost records the state had applied (they are gone for good)")

    p = command("replay", cmd_replay, "rebuild one custom projection from offset 0",
                "Import the projection class MODULE:CLASS (from the current directory or the installed "
                "packages), delete its state and replay the log into it from offset 0, with a progress bar.")
    p.add_argument("--projection", metavar="MODULE:CLASS", required=True)

    p = command("log", None, "tools for the log itself (log verify)")
    log_sub = p.add_subparsers(dest="log_command", metavar="LOG_COMMAND", parser_class=_Parser, required=True)
    p = command("verify", cmd_log_verify, "check every segment of the embedded file log without changing it",
                "Walk every segment of the embedded file log read-only and print the report, then count its "
                "records: plain, sealed (opened with DATA/keys read-only, beside a running server too), erased "
                "(their key destroyed by clear), clear, poison, missing key. Exit 0 when clean, 1 when damage "
                "is found or a sealed record's key is missing from the key store.", into=log_sub)
    p.add_argument("--frames-only", action="store_true",
                   help="check frames and offsets only; do not decode records (several times faster)")

    p = command("keygen", cmd_keygen, "write a new master key file (mode 0600, never overwrites)",
                "Write FILE with a new random 32-byte master key (mode 0600; refused if FILE exists) and print "
                "its id. It wraps the data keys of sealed content at rest: open with master_key_file= or set "
                "HISTLOG_MASTER_KEY_FILE (docs/erasure.md). Back the file up apart from the data: without "
                "it the keys it wraps, and so the history, cannot be read.")
    p.add_argument("file", metavar="FILE")

    p = command("keys", None, "tools for the key store (keys rotate)")
    keys_sub = p.add_subparsers(dest="keys_command", metavar="KEYS_COMMAND", parser_class=_Parser, required=True)
    p = command("rotate", cmd_keys_rotate, "rewrap the embedded key store under another master key",
                "Rewrite every data key record of DATA/keys under the master key --new-key FILE (or unwrapped, "
                "--unwrap), reading them with --old-key FILE (leave it out when the store is unwrapped: this "
                "also wraps an unwrapped store). Stop the engine first: it takes the key store's lock. Every "
                "record is read before any is written (a wrong --old-key changes nothing and names the master "
                "key id needed); each bucket file is replaced by an fsynced rename, so after a crash run the "
                "same command again. Afterwards the old master key opens nothing: open the engine with "
                "HISTLOG_MASTER_KEY_FILE=NEW. The Kafka keys topic cannot be rotated yet (docs/erasure.md §3).",
                into=keys_sub)
    p.add_argument("--old-key", metavar="FILE", help="the master key file the records are wrapped by now")
    new_key = p.add_mutually_exclusive_group()
    new_key.add_argument("--new-key", metavar="FILE", help="the master key file to wrap them by (histlog keygen)")
    new_key.add_argument("--unwrap", action="store_true", help="store the data keys unwrapped (no master key)")

    p = command("serve", cmd_serve, "serve the history over HTTP (docs/service.md)",
                "Serve this history over HTTP/1.1 + JSON (docs/service.md): prints listening=http://HOST:PORT "
                "on stdout once accepting; logs on stderr. SIGTERM or SIGINT drains the requests in flight, "
                "closes the engine and exits 0. A non-loopback --listen needs a token unless --insecure.")
    add_serve(p, _integer)

    p = command("cluster", cmd_cluster, "print a cluster's ownership map and each owner's lag (--url a member)",
                "Ask the member at --url (any member of a `serve --group` cluster) for its ownership map "
                "(GET /v1/cluster) and each owner for its stats: one line per partition with its owner and "
                "the records that owner has not applied yet. Exits 4 if an owner does not answer (the map is "
                "still printed). A server without --group shows itself owning every partition.")
    p.add_argument("--json", action="store_true", help='one JSON object: the map plus "members" (owned, lag)')

    p = command("bench", cmd_bench, "run the benchmarks (prints tables and writes a JSON)",
                "Run the benchmarks (installed with histlog): each prints ratios against a baseline "
                "measured in the same run. The kafka one uses HISTLOG_KAFKA or, in a source "
                "checkout, starts a broker with scripts/kafka.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="which benchmarks (default all): schemas codec log engine reads middleware turns kafka "
                        "service frameworks forward cluster langchain sealed erasure clears instructions postgres bulk "
                        "runs assets deletes langgraph console, "
                        "e.g. histlog bench instructions")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.add_argument("--only", metavar="NAMES", help="the same as NAME..., comma-separated")
    p.add_argument("--json", metavar="PATH", help="where to write the results (default bench/results/latest.json)")
    return parser


def subcommands(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """Every command path, e.g. ``["demo", "append", ..., "log verify", "bench"]`` (for docs checks)."""
    parser = parser or build_parser()
    names: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                nested = subcommands(child)
                names.extend([f"{name} {n}" for n in nested] if nested else [name])
    return names
