"""histlog vs PostgreSQL, the store a bot developer would pick instead (issue: "histlog vs its peer"):
durable idempotent appends, the newest-20 read, bytes on disk, both measured in the same run.

Run ``python -m bench.bench_postgres [--quick]`` or ``histlog bench postgres``. Prints a table and
one JSON line. It needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``: ``apt-get install
postgresql``) and psycopg 3 (``pip install 'histlog[bench]'``); without them ``run`` returns
``{"skipped": "<what is missing and how to install it>"}`` and the report prints that line.

**The server** is private to the run: ``initdb`` into a temporary directory (trust auth, UTF8,
locale C), listening on ``127.0.0.1`` on a free port and on a unix socket inside that directory,
``fsync = on``, ``synchronous_commit = on``, ``full_page_writes`` left at its default (on), every
other setting PostgreSQL's default; started with ``pg_ctl start`` and always stopped at the end
(``pg_ctl stop -m fast``), the directory removed. Run as root, ``initdb`` and ``pg_ctl`` run as the
``postgres`` user (``runuser``), the directory handed to it. Clients connect over the unix socket
(PostgreSQL's fastest local path; histlog has no hop at all), one connection per writer thread.

**The schema** (what an idempotent, content-checked history needs)::

    conversations (conversation_id PK, next_ordinal)                   -- the per-conversation counter
    batches  (conversation_id, append_id) PK, digest, first_ordinal    -- the content check
    messages (conversation_id, append_id, idx) PK, ordinal, content    -- idempotent rows
             + INDEX (conversation_id, ordinal)                        -- the newest-N read

``content`` is each message's canonical JSON as ``bytea`` (the exact bytes histlog stores and
digests; ``jsonb`` would add a parse on every write and a re-serialisation on every read). One
append = one call of a PL/pgSQL function ``append_batch`` in autocommit, i.e. one round trip and
one transaction: lock the conversation's row (``SELECT ... FOR UPDATE``, created on first use),
``INSERT`` the batch row ``ON CONFLICT DO NOTHING``; if it existed, compare its digest
(``duplicate`` or ``conflict``), else insert the messages at the next ordinals and advance the
counter. The batches are ``bench.common.batch`` 2-message turns on ``bench.common.conversation``'s
conversations (10 turns each), built before the clock starts, the same ones for both stores.

**histlog** is ``HistoryEngine.open(dir, fsync="always")`` (the default, sealed records) and
``engine.append(batch)``, one engine holding everything the PostgreSQL database holds.

Cases:

* **appends/s** at 1, 16 and 64 writer threads (``bench.common.run_measured``), in rounds that
  alternate which store goes first, each round on fresh conversations; the rate is all appends
  over all the rounds' time, with p50/p99 latency. Ratio histlog ÷ PostgreSQL (higher is better).
* **newest-20 read** of a 2,000-message conversation: p50/p99 µs of ``SELECT content FROM
  messages WHERE conversation_id = $1 ORDER BY ordinal DESC LIMIT 20`` (prepared; the plan, an
  index scan, is reported) vs ``engine.window(conv, 20)`` (what bench_engine's read case calls),
  samples interleaved; also the query plus ``Message.from_canonical`` of its rows, which is what
  ``window`` hands back. Ratio histlog ÷ PostgreSQL p50 (lower is better).
* **bytes on disk per message** (apparent file sizes, walking the directory): PostgreSQL's
  ``pg_total_relation_size`` of the three tables (indexes and TOAST included) and its whole data
  directory (catalog and WAL included: a fixed ~40 MB that dominates small runs) while running and
  after ``pg_ctl stop``; histlog's whole directory while the engine is open and after ``close``.
  Ratios histlog ÷ PostgreSQL (lower is better).

Goals (from the issue; reported, never asserted): appends ≥ 1.5 times PostgreSQL's at 16 and 64
writers; newest-20 read p50 ≤ PostgreSQL's; bytes per message ≤ PostgreSQL's (tables + indexes)
after close and ≤ 1.5 times while open.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import Run, batch, conversation, percentiles, progress_printer, run_measured
from bench.pg_server import Server, du, missing, pg_bin
from engine import HistoryEngine
from schemas import Batch, Message

if TYPE_CHECKING:
    import psycopg

__all__ = ["Sizes", "report", "run"]

WRITERS = (1, 16, 64)
READ_LIMIT = 20

SCHEMA = """
CREATE TABLE conversations (
    conversation_id text PRIMARY KEY,
    next_ordinal bigint NOT NULL
);
CREATE TABLE batches (
    conversation_id text NOT NULL,
    append_id text NOT NULL,
    digest text NOT NULL,
    first_ordinal bigint NOT NULL,
    PRIMARY KEY (conversation_id, append_id)
);
CREATE TABLE messages (
    conversation_id text NOT NULL,
    append_id text NOT NULL,
    idx smallint NOT NULL,
    ordinal bigint NOT NULL,
    content bytea NOT NULL,
    PRIMARY KEY (conversation_id, append_id, idx)
);
CREATE INDEX messages_newest ON messages (conversation_id, ordinal);
CREATE FUNCTION append_batch(c text, a text, d text, contents bytea[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    first bigint;
    known text;
BEGIN
    SELECT next_ordinal INTO first FROM conversations WHERE conversation_id = c FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO conversations VALUES (c, 0) ON CONFLICT DO NOTHING;
        SELECT next_ordinal INTO first FROM conversations WHERE conversation_id = c FOR UPDATE;
    END IF;
    INSERT INTO batches VALUES (c, a, d, first) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        SELECT digest INTO known FROM batches WHERE conversation_id = c AND append_id = a;
        RETURN CASE WHEN known = d THEN 'duplicate' ELSE 'conflict' END;
    END IF;
    INSERT INTO messages
        SELECT c, a, i - 1, first + i - 1, contents[i] FROM generate_subscripts(contents, 1) AS i;
    UPDATE conversations SET next_ordinal = first + cardinality(contents) WHERE conversation_id = c;
    RETURN 'appended';
END
$$;
"""

NEWEST = "SELECT content FROM messages WHERE conversation_id = %s ORDER BY ordinal DESC LIMIT %s"
TABLE_BYTES = ("SELECT t::text, pg_table_size(t), pg_indexes_size(t) "
               "FROM unnest(ARRAY['conversations', 'batches', 'messages']::regclass[]) AS t")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work: appends per store at 16 and 64 writers (``appends``) and at 1 writer
    (``solo_appends``: one fsync each, slow when the disk is), split over ``rounds``; the read
    conversation's messages and the number of read samples per store."""

    appends: int
    solo_appends: int
    rounds: int
    read_messages: int
    read_samples: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(4_000, 800, 2, 2_000, 500) if quick else cls(24_000, 4_000, 4, 2_000, 3_000)


# -- the two stores' appends ------------------------------------------------------------------

def _pg_append(conn: psycopg.Connection[Any], b: Batch) -> None:
    row = conn.execute("SELECT append_batch(%s, %s, %s, %s)",
                       (b.conversation_id, str(b.append_id), b.digest, [m.canonical_json() for m in b.messages]),
                       prepare=True).fetchone()
    assert row is not None and row[0] == "appended"  # Invariant: every bench batch is new.


def _pg_nth(conns: list[psycopg.Connection[Any]], bs: list[list[Batch]], t: int, i: int) -> None:
    _pg_append(conns[t], bs[t][i])


def _histlog_nth(engine: HistoryEngine, bs: list[list[Batch]], t: int, i: int) -> None:
    engine.append(bs[t][i])


def _pool_rate(runs: list[Run]) -> tuple[float, list[float]]:
    """All the rounds' appends over all their time, and every latency."""
    calls = sum(len(r.latencies_us) for r in runs)
    return calls / sum(len(r.latencies_us) / r.per_s for r in runs), [x for r in runs for x in r.latencies_us]


def _appends(conns: list[psycopg.Connection[Any]], engine: HistoryEngine, writers: int, sizes: Sizes,
             say: Callable[[str], None]) -> tuple[dict[str, Any], int]:
    per = max((sizes.solo_appends if writers == 1 else sizes.appends) // writers // sizes.rounds, 1)
    pg_runs: list[Run] = []
    hl_runs: list[Run] = []
    for r in range(sizes.rounds):
        tag = f"w{writers}-r{r}-"
        bs = [[batch(tag + conversation(t, i), f"a-{t}-{i}") for i in range(per)] for t in range(writers)]
        cases: list[tuple[list[Run], Callable[[int, int], object]]] = [
            (pg_runs, partial(_pg_nth, conns, bs)), (hl_runs, partial(_histlog_nth, engine, bs))]
        for runs, fn in cases if r % 2 == 0 else cases[::-1]:
            gc.collect()
            runs.append(run_measured(writers, per, fn))
        say(f"appends, {writers} writers: round {r + 1}/{sizes.rounds}: postgres {pg_runs[-1].per_s:.0f}/s, "
            f"histlog {hl_runs[-1].per_s:.0f}/s")
    pg_rate, pg_lat = _pool_rate(pg_runs)
    hl_rate, hl_lat = _pool_rate(hl_runs)
    p50, p99 = percentiles(pg_lat)
    h50, h99 = percentiles(hl_lat)
    row = {"writers": writers, "appends": len(pg_lat), "postgres_per_s": round(pg_rate),
           "histlog_per_s": round(hl_rate), "ratio": round(hl_rate / pg_rate, 2),
           "postgres_p50_ms": round(p50 / 1000, 2), "postgres_p99_ms": round(p99 / 1000, 2),
           "histlog_p50_ms": round(h50 / 1000, 2), "histlog_p99_ms": round(h99 / 1000, 2),
           "rounds_postgres_per_s": [round(x.per_s) for x in pg_runs],
           "rounds_histlog_per_s": [round(x.per_s) for x in hl_runs]}
    return row, 2 * len(pg_lat)


def _reads(conn: psycopg.Connection[Any], engine: HistoryEngine, sizes: Sizes,
           progress: bool) -> tuple[dict[str, Any], int]:
    conv = f"read-{sizes.read_messages}"
    turns = max(sizes.read_messages // 2, READ_LIMIT)
    show = progress_printer(progress, "loading the read conversation, turns:")
    batches = [batch(conv, f"a-{i}") for i in range(turns)]
    errors: list[BaseException] = []

    def load_pg() -> None:  # not timed: one transaction (the same rows, one commit)
        try:
            with conn.transaction():
                for b in batches:
                    _pg_append(conn, b)
        except BaseException as e:
            errors.append(e)

    loader = threading.Thread(target=load_pg)
    loader.start()
    for i, b in enumerate(batches):  # meanwhile, histlog: its appends are durable one by one
        engine.append(b)
        if i % 50 == 49 or i == turns - 1:
            show(i + 1, turns)
    loader.join()
    if errors:
        raise errors[0]
    if progress:
        print(file=sys.stderr)
    plan_rows = conn.execute("EXPLAIN (COSTS OFF) " + NEWEST.replace("%s", "%s::text", 1), (conv, READ_LIMIT))
    plan = " ".join(str(r[0]).strip() for r in plan_rows if "Index Cond" not in str(r[0]))
    expected = [m.canonical_json() for m in engine.window(conv, READ_LIMIT)]

    def pg_raw() -> list[bytes]:
        return [bytes(r[0]) for r in conn.execute(NEWEST, (conv, READ_LIMIT), prepare=True).fetchall()][::-1]

    def pg_messages() -> list[Message]:
        return [Message.from_canonical(x) for x in pg_raw()]

    assert pg_raw() == expected and len(expected) == READ_LIMIT  # Invariant: both stores return the same 20.
    cases: dict[str, Callable[[], object]] = {"postgres": pg_raw, "postgres_decoded": pg_messages,
                                              "histlog": lambda: engine.window(conv, READ_LIMIT)}
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm up: prepared statement, caches
        for _ in range(20):
            fn()
    gc.collect()
    for _ in range(sizes.read_samples):  # interleaved, so a noisy neighbour hits every case alike
        for name, fn in cases.items():
            started = time.perf_counter_ns()
            fn()
            samples[name].append((time.perf_counter_ns() - started) / 1000)
    out: dict[str, Any] = {"messages": turns * 2, "limit": READ_LIMIT, "samples": sizes.read_samples,
                           "postgres_plan": plan}
    for name, xs in samples.items():
        p50, p99 = percentiles(xs)
        out[f"{name}_p50_us"], out[f"{name}_p99_us"] = round(p50, 1), round(p99, 1)
    out["ratio_p50"] = round(out["histlog_p50_us"] / out["postgres_p50_us"], 2)
    out["ratio_p50_vs_decoded"] = round(out["histlog_p50_us"] / out["postgres_decoded_p50_us"], 2)
    return out, turns * 2


def run(quick: bool = False, progress: bool = True, sizes: Sizes | None = None) -> dict[str, Any]:
    why = missing()
    if why is not None:
        return {"bench": "postgres", "skipped": why}
    import psycopg

    sizes = sizes or Sizes.of(quick)
    bindir = pg_bin()
    assert bindir is not None  # Invariant: missing() checked it.

    def say(line: str) -> None:
        if progress:
            print(f"  {line}", file=sys.stderr, flush=True)

    root = Path(tempfile.mkdtemp(prefix="histlog-bench-vs-pg-"))
    server = Server(bindir)
    conns: list[psycopg.Connection[Any]] = []
    engine: HistoryEngine | None = None
    try:
        try:
            server.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            return {"bench": "postgres", "skipped": f"skipped: PostgreSQL did not start: {e}"}
        conns.append(server.connect())
        version = str(conns[0].execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        settings = {k: str(conns[0].execute(f"SHOW {k}").fetchone()[0])  # type: ignore[index]
                    for k in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
                              "shared_buffers")}
        conns[0].execute(SCHEMA)
        conns += [server.connect() for _ in range(max(WRITERS) - 1)]
        say(f"PostgreSQL {version} on port {server.port} (pid {server.pid}), {len(conns)} connections")
        hl_dir = root / "histlog"
        engine = HistoryEngine.open(hl_dir, fsync="always")
        appends = []
        messages = 0
        for w in WRITERS:
            row, n = _appends(conns, engine, w, sizes, say)
            appends.append(row)
            messages += n
        reads, n = _reads(conns[0], engine, sizes, progress)
        messages += n
        pg_count = int(conns[0].execute("SELECT count(*) FROM messages").fetchone()[0])  # type: ignore[index]
        assert pg_count == messages  # Invariant: both stores hold the same messages.
        tables = {str(name): {"table_bytes": int(heap), "index_bytes": int(index)}
                  for name, heap, index in conns[0].execute(TABLE_BYTES).fetchall()}
        pg_tables = sum(t["table_bytes"] + t["index_bytes"] for t in tables.values())
        pg_running = du(server.data)
        hl_open = du(hl_dir)
        engine.close()
        engine = None
        hl_closed = du(hl_dir)
        for c in conns:
            c.close()
        conns.clear()
        server.stop()
        pg_stopped = du(server.data)
    finally:
        for c in conns:
            c.close()
        if engine is not None:
            engine.close()
        server.remove()
        shutil.rmtree(root, ignore_errors=True)

    def per(x: int) -> float:
        return round(x / messages, 1)

    def ratio(a: int, b: int) -> float:  # 3 significant digits: a small run's data directory is mostly catalog
        return float(f"{a / b:.3g}")

    disk = {"messages": messages, "postgres_tables_per_msg": per(pg_tables),
            "postgres_datadir_running_per_msg": per(pg_running), "postgres_datadir_stopped_per_msg": per(pg_stopped),
            "histlog_open_per_msg": per(hl_open), "histlog_closed_per_msg": per(hl_closed),
            "open_vs_tables": ratio(hl_open, pg_tables), "closed_vs_tables": ratio(hl_closed, pg_tables),
            "open_vs_datadir": ratio(hl_open, pg_running), "closed_vs_datadir": ratio(hl_closed, pg_stopped)}
    return {"bench": "postgres", "postgres_version": version, "psycopg_version": psycopg.__version__,
            "postgres_settings": settings, "transport": "unix socket", "content": "bytea (canonical JSON)",
            "port": server.port, "postgres_pid": server.pid, "postgres_dir": str(server.root),
            "appends": appends, "reads": reads, "disk": disk, "postgres_tables": tables}


def report(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return str(result["skipped"])
    s = result["postgres_settings"]
    lines = [f"histlog (HistoryEngine, fsync=always) vs PostgreSQL {result['postgres_version']} (fsync={s['fsync']}, "
             f"synchronous_commit={s['synchronous_commit']}, full_page_writes={s['full_page_writes']}; "
             f"psycopg {result['psycopg_version']}, {result['transport']})",
             "durable idempotent appends/s, 2-message batches (ratio histlog/postgres, higher is better; goal >= 1.5 "
             "at 16 and 64)",
             f"  {'writers':>7} {'postgres':>9} {'histlog':>9} {'ratio':>6}   {'p50 / p99 ms postgres':>22} "
             f"{'histlog':>15}"]
    for a in result["appends"]:
        lines.append(f"  {a['writers']:>7} {a['postgres_per_s']:>9} {a['histlog_per_s']:>9} {a['ratio']:>6}   "
                     f"{a['postgres_p50_ms']:>10} / {a['postgres_p99_ms']:<9} "
                     f"{a['histlog_p50_ms']:>6} / {a['histlog_p99_ms']:<6}")
    r = result["reads"]
    lines += [f"newest-{r['limit']} read of a {r['messages']}-message conversation, µs (ratio histlog/postgres p50, "
              "lower is better; goal <= 1)",
              f"  postgres query ({r['postgres_plan']}): p50 {r['postgres_p50_us']} p99 {r['postgres_p99_us']}",
              f"  postgres query + Message.from_canonical: p50 {r['postgres_decoded_p50_us']} "
              f"p99 {r['postgres_decoded_p99_us']}",
              f"  histlog window(conv, {r['limit']}): p50 {r['histlog_p50_us']} p99 {r['histlog_p99_us']}   "
              f"ratio {r['ratio_p50']} (vs query + decode {r['ratio_p50_vs_decoded']})"]
    d = result["disk"]
    lines += [f"bytes on disk per message, {d['messages']} messages (ratio histlog/postgres, lower is better; goal "
              "<= 1 closed, <= 1.5 open, vs tables)",
              f"  postgres tables + indexes {d['postgres_tables_per_msg']}; data directory running "
              f"{d['postgres_datadir_running_per_msg']}, stopped {d['postgres_datadir_stopped_per_msg']}",
              f"  histlog open   {d['histlog_open_per_msg']:>8}   vs tables {d['open_vs_tables']:>5}   "
              f"vs data directory (running) {d['open_vs_datadir']}",
              f"  histlog closed {d['histlog_closed_per_msg']:>8}   vs tables {d['closed_vs_tables']:>5}   "
              f"vs data directory (stopped) {d['closed_vs_datadir']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
