"""The cluster fault tests' parts: ``histlog serve --group`` members as real subprocesses, a
recorded load of appends and reads through random members and routed clients, and the finals
read from every member for the history checker (``tests/history_checker.py``).

Every wait is bounded and waits on a condition (polling HTTP: a member has no push channel);
every process started here is killed by ``MemberProcess.stop`` (the tests' finalizers).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from engine import AsyncHistoryClient
from schemas import Batch, Message, Receipt, StoredMessage
from schemas.records import partition_for_key, record_key
from tests.history_checker import AsyncRecorded, History, Report, check
from tests.reliability.pipe_lines import PipeLines

__all__ = [
    "PARTITIONS",
    "SESSION_TIMEOUT",
    "Load",
    "MemberProcess",
    "batch_of",
    "checked",
    "conversations_on_every_partition",
    "fill_partitions",
    "finals_of",
    "get_json",
    "metric",
    "resend_everything",
    "start_all",
    "wait_until",
    "whole_map",
]

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 6
SESSION_TIMEOUT = 6.0  # the broker's minimum: failover is as fast as Kafka allows
START_S = 60.0


def wait_until(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); AssertionError naming
    ``what`` after ``timeout`` seconds. Exceptions of the condition count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
            if value:
                return value
            last = value
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")
        time.sleep(every)


def get_json(url: str, path: str) -> Any:
    """``GET url+path``'s JSON (any status: a problem is JSON too)."""
    return httpx.get(url + path, timeout=5.0).json()


def conversations_on_every_partition(per_partition: int, partitions: int = PARTITIONS) -> list[str]:
    """Conversation ids, ``per_partition`` on each partition (the log's partitioner), so every
    member owns some whatever the assignment."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(v) < per_partition for v in found.values()):
        c = f"bot/{i}"
        p = partition_for_key(record_key(c), partitions)
        if len(found[p]) < per_partition:
            found[p].append(c)
        i += 1
    return sorted(c for v in found.values() for c in v)


class MemberProcess:
    """``python3 -m engine --kafka K --topic T --state DIR serve --listen 127.0.0.1:0 --group G
    --advertise http://127.0.0.1:0 --session-timeout S`` as a child process; ``url`` is the
    advertised URL (the listening port). A restart (``start`` again) listens on the same port, so
    the member keeps its URL, as a restarted machine keeps its address. ``stop()`` kills it if
    still running."""

    def __init__(self, name: str, kafka: str, topic: str, group: str, state: Path, log: Path,
                 *extra: str, session_timeout: float = SESSION_TIMEOUT) -> None:
        self.name, self.kafka, self.topic, self.group, self.state = name, kafka, topic, group, state
        self.log_path, self.extra, self.session_timeout = log, extra, session_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = 0
        self._log: IO[bytes] | None = None

    def start(self) -> MemberProcess:
        self.stop()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "--kafka", self.kafka, "--topic", self.topic, "--state", str(self.state),
             "serve", "--listen", f"127.0.0.1:{self.port}", "--group", self.group,
             "--advertise", f"http://127.0.0.1:{self.port}",
             "--session-timeout", str(self.session_timeout), *self.extra],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log, bufsize=0)
        assert self.proc.stdout is not None
        line = PipeLines(self.proc.stdout.fileno()).line(time.monotonic() + START_S)
        assert line is not None and line.startswith(b"listening=http://"), \
            f"member {self.name} printed {line!r}; its log: {self.stderr()[-2000:]}"
        self.url = line.decode().strip().removeprefix("listening=")
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "never started"
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = START_S) -> int:
        assert self.proc is not None, "never started"
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def owned(self) -> set[int]:
        """The partitions this member's own ``/v1/cluster`` says it owns."""
        m = get_json(self.url, "/v1/cluster")
        return {int(p) for p, u in m["owners"].items() if u == m["self"]}

    def ready(self) -> bool:
        return httpx.get(self.url + "/readyz", timeout=5.0).status_code == 200

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)  # a paused member must be able to die
                self.proc.kill()
                self.proc.wait(timeout=START_S)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def start_all(members: Sequence[MemberProcess], timeout: float = START_S) -> None:
    """Start ``members`` in parallel (each start waits for its URL), bounded by ``timeout``."""
    import threading

    threads = [threading.Thread(target=m.start) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert all(m.url for m in members), [m.stderr()[-1500:] for m in members if not m.url]


def metric(m: MemberProcess, name: str) -> float | None:
    """The value of the unlabelled sample ``name`` on the member's ``/metrics`` (None if absent)."""
    for line in httpx.get(m.url + "/metrics", timeout=5.0).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def whole_map(members: Sequence[MemberProcess], partitions: int = PARTITIONS) -> dict[int, str]:
    """The map every one of ``members`` agrees on, once it covers every partition with one of
    their URLs and each of them is ready; else ``ValueError`` saying what is missing (for
    ``wait_until``, which shows the last one when it gives up)."""
    urls = {m.url for m in members}
    maps = [get_json(m.url, "/v1/cluster") for m in members]
    owners = [{int(p): u for p, u in mp["owners"].items()} for mp in maps]
    first = owners[0]
    if len(first) != partitions or set(first.values()) - urls or any(o != first for o in owners[1:]):
        raise ValueError(f"no agreement on a whole map: {maps}")
    if any(mp["generation"] < 0 for mp in maps):
        raise ValueError(f"a member is out of the group: {maps}")
    if not all(m.ready() for m in members):
        raise ValueError(f"not every member is ready: {[(m.url, m.ready()) for m in members]}")
    return first


def fill_partitions(kafka: str, topic: str, conversations: Sequence[str], per: int, partitions: int) -> None:
    """``per`` appends to each conversation written straight to the topic by a raw producer (as
    another member would, only faster), each on its conversation's partition."""
    from kafka import KafkaProducer

    from schemas.events import BatchAppended, encode_event
    from schemas.times import now_ms

    producer = KafkaProducer(bootstrap_servers=kafka, acks="all", linger_ms=20)
    try:
        for k, c in enumerate(conversations):
            p = partition_for_key(record_key(c), partitions)
            for i in range(per):
                b = batch_of(k, i, c)
                producer.send(topic, key=record_key(b.conversation_id, b.append_id),
                              value=encode_event(BatchAppended.of(b, now_ms())), partition=p)
        producer.flush()
    finally:
        producer.close()


def batch_of(client: int, i: int, conversation: str) -> Batch:
    aid = f"a-{client}-{i}"
    return Batch(conversation, aid, [Message.user(f"question {aid}"), Message.assistant(f"answer {aid}")])


class Load:
    """``clients`` bots appending ``per_client`` batches each, recorded in ``history``: even bots
    through ``AsyncHistoryClient(urls)`` (routed straight to owners), odd bots through one member
    chosen at random per call among ``live`` (that member forwards). After each acknowledged
    append a bot reads its conversation ``at_least`` that receipt through another random member.
    ``on_ack(n)`` runs after the n-th acknowledged append (a test's fault trigger, by count)."""

    def __init__(self, history: History, urls: Sequence[str], conversations: Sequence[str], *, clients: int = 12,
                 per_client: int = 12, timeout: float = 25.0, seed: int = 14) -> None:
        self.history, self.urls, self.conversations = history, list(urls), list(conversations)
        self.live = list(urls)
        self.clients, self.per_client, self.timeout = clients, per_client, timeout
        self.rng = random.Random(seed)
        self.acks = 0

    async def run(self, on_ack: Callable[[int], None] = lambda n: None) -> None:
        singles: dict[str, AsyncHistoryClient] = {}
        routed = AsyncHistoryClient(self.urls, timeout=self.timeout)

        def single(url: str) -> AsyncHistoryClient:
            if url not in singles:
                singles[url] = AsyncHistoryClient(url, timeout=self.timeout)
            return singles[url]

        async def bot(k: int) -> None:
            conversation = self.conversations[k % len(self.conversations)]
            for i in range(self.per_client):
                via = routed if k % 2 == 0 else single(self.rng.choice(self.live))
                try:
                    receipt = await AsyncRecorded(via, self.history, k).append(batch_of(k, i, conversation))
                except Exception:
                    continue  # recorded as fail or unknown; the next batch goes on
                self.acks += 1
                on_ack(self.acks)
                reader = single(self.rng.choice(self.live))
                try:
                    await AsyncRecorded(reader, self.history, f"r{k}").read(conversation, at_least=receipt)
                except Exception:
                    pass  # recorded; reads judged by the checker

        try:
            await asyncio.gather(*(bot(k) for k in range(self.clients)))
        finally:
            await routed.close()
            for c in singles.values():
                await c.close()


async def resend_everything(history: History, urls: Sequence[str], timeout: float = 30.0) -> None:
    """Every bot resends each batch it sent, in order, through a routed client (which retries):
    the checker then requires an acknowledged batch's receipt to be its first one."""
    sent: dict[object, list[Batch]] = {}
    for o in history.ops:
        if o.kind == "append":
            sent.setdefault(o.process, []).append(o.args["batch"])
    async with AsyncHistoryClient(list(urls), timeout=timeout) as client:
        async def resend(k: object) -> None:
            for batch in sent[k]:
                await AsyncRecorded(client, history, f"resend-{k}").append(batch)

        await asyncio.gather(*(resend(k) for k in sent))


Finals = dict[str, dict[str, list[StoredMessage]]]


async def finals_of(history: History, urls: Iterable[str], timeout: float = 30.0) -> Finals:
    """Each member's final entries of every conversation, each read after a read ``at_least``
    the conversation's last acknowledged receipt through that member (read-your-writes)."""
    latest: dict[str, Receipt] = {}
    for o in history.ops:
        if o.kind == "append" and o.outcome == "ok":
            c = o.conversation
            if c not in latest or o.value.position > latest[c].position:
                latest[c] = o.value
    out: Finals = {}
    for url in urls:
        async with AsyncHistoryClient(url, timeout=timeout) as client:
            me: dict[str, list[StoredMessage]] = {}
            for c in history.conversations():
                if c in latest:
                    await client.read(c, at_least=latest[c])
                me[c] = await client.entries(c)
            out[url] = me
    return out


def checked(history: History, finals: Finals) -> Report:
    """The checker's report, raising with every anomaly if there is one."""
    return check(history, finals).assert_valid()
