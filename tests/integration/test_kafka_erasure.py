"""Erasure agreement across two instances on one real Kafka topic (issue 16).

Two instances are two ``HistoryEngine.open(kafka=..., topic=T, state_dir=own dir)`` sharing the
keys topic ``T.keys``. Proved here, each with bounded waits on conditions:

1. an identical retry through the other instance is a duplicate (the same receipt) and a
   different batch under the same append id is ``AppendConflict``, on both instances, through
   the log (the writer's local pre-check switched off) and through the pre-check;
2. instances racing on new conversations' first batches agree: one accepted batch each, the
   loser a duplicate (same content) or a conflict (different content), though each instance
   seals under the spare key it bound to the conversation (two live keys; met by chance in the
   race and forced in order), and a clear destroys both (the key ids come from the records);
   content sealed under a conversation's own key record written raw beside them is admitted
   by content, exactly as under the first;
3. an instance that was closed during another's append-and-clear ends erased, closed and equal
   to the other, counts the records it met erased, and no file of either state holds the token;
   an instance that had applied the content forgets it when it applies the other's clear;
4. a third instance rebuilt from scratch after the clear equals the first;
5. a clear through one instance racing appends through the other: every append has a receipt
   from before the clear in the log or ``ConversationClosed``, and nothing of the conversation
   is readable (or in any state file) anywhere afterwards. Each instance decides a record by
   its own key store: a record before the clear that B meets after its store learnt of A's
   erasure is *erased* on B (its writer: ``ConversationClosed``) though A accepted it; that
   interleaving, met by chance in the race, is also forced (both ways) by holding B's projector.

The token scans read every byte of every file of a state directory; each scan that must find
nothing has a twin, before the clear, that finds the token (so the scan could fail).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import engine.writes
from engine import HistoryEngine
from engine.keys import keys_topic_of
from engine.keys.record import record_key, split_record_key
from schemas import AppendConflict, Batch, ConversationClosed, LogPosition, Message, Receipt
from schemas.errors import KeyErased
from schemas.events import BatchAppended, ConversationCleared
from schemas.sealed import DataKey
from tests.conformance.backends import KafkaBackend
from tests.conformance.facade_contract import turn
from tests.integration.erasure_support import (
    WAIT_S,
    RawProducer,
    accepted_batches,
    assert_erased_and_closed,
    conversation_records,
    counters,
    files_holding,
    key_records,
    keys_of,
    needles_of,
    observed,
    store_of,
    token,
    token_batch,
    wait_until,
)

pytestmark = pytest.mark.kafka
PARTITIONS = 2


@pytest.fixture(autouse=True)
def _no_master_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw key records below are unwrapped; the engines must not expect a master key."""
    monkeypatch.delenv("HISTLOG_MASTER_KEY_FILE", raising=False)


@pytest.fixture
def backend(kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaBackend:
    return KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "a", partitions=PARTITIONS)


@pytest.fixture
def pair(backend: KafkaBackend, tmp_path: Path) -> Iterator[tuple[HistoryEngine, HistoryEngine]]:
    a = backend.open(tmp_path / "a")  # creates the topic (and its keys topic) once
    b = backend.open(tmp_path / "b")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.fixture
def raw(backend: KafkaBackend, pair: tuple[HistoryEngine, HistoryEngine]) -> Iterator[RawProducer]:
    producer = RawProducer(backend.bootstrap, backend.topic, PARTITIONS)
    try:
        yield producer
    finally:
        producer.close()


@pytest.fixture
def through_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch off the writers' pre-check on local state (an optimisation): every append is
    produced, and the projector's admission on each instance decides alone."""
    monkeypatch.setattr(engine.writes, "precheck", lambda *args, **kwargs: None)


# -- 1. retries and conflicts across instances ----------------------------------------------------
@pytest.mark.parametrize("path", ["log", "precheck"])
def test_a_retry_through_the_other_instance_is_a_duplicate_and_other_content_a_conflict(
        pair: tuple[HistoryEngine, HistoryEngine], path: str, request: pytest.FixtureRequest) -> None:
    """Each record sealed with its own nonce under the conversation's one key: admission on both
    instances compares the opened content's digests, as it did for plain records."""
    a, b = pair
    if path == "log":
        request.getfixturevalue("through_the_log")
    batch = turn("c", "a1", "hello", tool=True)
    receipt = a.append(batch)
    if path == "precheck":
        b.wait_applied(receipt.position, WAIT_S)
    assert b.append(batch) == receipt  # the identical retry, through the other instance
    assert a.append(batch) == receipt
    for e in (a, b):
        with pytest.raises(AppendConflict) as conflict:
            e.append(turn("c", "a1", "other content"))
        assert conflict.value.existing_digest == receipt.digest
        assert e.read("c", at_least=receipt) == list(batch.messages)
    records = conversation_records(a, "c")
    assert all(isinstance(ev, BatchAppended) and ev.sealed is not None and ev.messages == b"" for _, ev in records)
    # Each instance seals under the spare it bound to the conversation; the first record is A's.
    bound = {e: {k for _, k in keys_of(e, "c")} for e in pair}
    assert len(bound[a]) == 1 and records[0][1].sealed is not None and {records[0][1].sealed.key_id} == bound[a]
    assert {ev.sealed.key_id for _, ev in records if isinstance(ev, BatchAppended) and ev.sealed} <= bound[a] | bound[b]
    # Through the log: 5 records (the first, 2 retries, 2 conflicts); through the pre-check: only the first.
    logged = 2 if path == "log" else 0
    assert len(records) == 1 + 2 * logged
    assert observed(a) == observed(b)
    assert counters(a) == counters(b) == {**dict.fromkeys(counters(a), 0), "accepted": 1, "duplicates": logged,
                                          "conflicts": logged}


# -- 2. racing first batches -------------------------------------------------------------------------
def test_instances_racing_on_new_conversations_agree(pair: tuple[HistoryEngine, HistoryEngine],
                                                     backend: KafkaBackend) -> None:
    """50 new conversations, each raced by both instances (threads released by a barrier): even
    ones with identical batches, odd ones with different content under the same append id."""
    a, b = pair
    n = 50
    barrier = threading.Barrier(2)
    outcomes: dict[tuple[int, int], Receipt | AppendConflict] = {}
    errors: list[BaseException] = []

    def batch_of(k: int, i: int) -> Batch:
        who = "both" if i % 2 == 0 else f"instance {k}"
        return Batch(f"race-{i}", "first", [Message.user(f"q{i} from {who}"), Message.assistant(f"a{i}")])

    def run(k: int, e: HistoryEngine) -> None:
        try:
            for i in range(n):
                barrier.wait(timeout=WAIT_S)
                try:
                    outcomes[(k, i)] = e.append(batch_of(k, i))
                except AppendConflict as exc:
                    outcomes[(k, i)] = exc
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(k, e)) for k, e in enumerate(pair)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_S * 3)
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert observed(a) == observed(b)
    for i in range(n):
        conv, got = f"race-{i}", [outcomes[(0, i)], outcomes[(1, i)]]
        receipts = [o for o in got if isinstance(o, Receipt)]
        if i % 2 == 0:  # identical content: both hold the one receipt
            assert len(receipts) == 2 and receipts[0] == receipts[1], got
        else:  # different content: one receipt, the other a conflict naming the winner's digest
            assert len(receipts) == 1, got
            (lost,) = [o for o in got if isinstance(o, AppendConflict)]
            assert lost.existing_digest == receipts[0].digest
        winner = receipts[0]
        records = conversation_records(a, conv)  # admission's rule: the first record in log order wins
        assert winner.position.offset == records[0][0] and 1 <= len(records) <= 2
        won_by = [k for k in (0, 1) if batch_of(k, i).digest == winner.digest]
        for e in pair:  # exactly one accepted batch, the winner's content, on both instances
            assert accepted_batches(e, conv) == {"first": [m.canonical_json() for m in batch_of(won_by[0], i).messages]}
        # Each record is sealed under the spare its writer's instance bound to the conversation:
        # never one key for two instances, and every key opens on both.
        bound = [{k for _, k in keys_of(e, conv)} for e in pair]
        assert all(len(ids) <= 1 for ids in bound) and not (bound[0] & bound[1])
        sealed_under = {ev.sealed.key_id for _, ev in records if isinstance(ev, BatchAppended) and ev.sealed}
        assert sealed_under <= bound[0] | bound[1] and len(sealed_under) == len(records)
        for e in pair:
            assert all(store_of(e).get(conv, k) for k in sealed_under)
    # On the keys topic: spares only (no key record of any conversation: nothing to race on).
    assert all(split_record_key(k)[0] == "" for k, _ in key_records(backend.bootstrap, keys_topic_of(backend.topic)))
    ca = counters(a)
    assert ca == counters(b) and ca["accepted"] == n and ca["corrupt"] == 0
    assert ca["duplicates"] <= n // 2 and ca["conflicts"] <= n // 2
    print(f"\nracing first batches: {ca['duplicates'] + ca['conflicts']} of {n} losers reached the log "
          f"(duplicates {ca['duplicates']}, conflicts {ca['conflicts']}), the others were answered by the "
          "pre-check")


@pytest.mark.parametrize("same_content", [True, False])
def test_first_batches_sealed_under_each_instances_own_spare_agree_by_content(
        pair: tuple[HistoryEngine, HistoryEngine], backend: KafkaBackend, through_the_log: None,
        same_content: bool) -> None:
    """The race above, forced in order: A's first batch, then B's for the same conversation, each
    sealed under the spare its instance bound (two live keys for one conversation). Admission on
    both instances compares the opened content: B's is a duplicate or a conflict, as for plain
    records. A clear through B then destroys both keys: the ids come from the records (K rows)."""
    a, b = pair
    mine = turn("two-spares", "first", "from A")
    theirs = mine if same_content else turn("two-spares", "first", "from B")
    receipt = a.append(mine)
    if same_content:
        assert b.append(theirs) == receipt
    else:
        with pytest.raises(AppendConflict) as conflict:
            b.append(theirs)
        assert conflict.value.existing_digest == receipt.digest
    records = conversation_records(a, "two-spares")
    k_a, k_b = (ev.sealed.key_id for _, ev in records if isinstance(ev, BatchAppended) and ev.sealed)
    assert k_a != k_b and keys_of(a, "two-spares") == [("two-spares", k_a)] and keys_of(b, "two-spares") == [
        ("two-spares", k_b)]
    assert receipt.position.offset == records[0][0]
    assert observed(a) == observed(b)
    for e in pair:
        assert e.read("two-spares") == list(mine.messages)
        assert counters(e)["duplicates" if same_content else "conflicts"] == 1
    b.clear("two-spares")
    assert a.catch_up(timeout=WAIT_S)
    latest = dict(key_records(backend.bootstrap, keys_topic_of(backend.topic)))
    assert latest[record_key("", k_a)] is None and latest[record_key("", k_b)] is None  # both tombstoned
    for e in pair:
        assert_erased_and_closed(e, "two-spares")
        for k in (k_a, k_b):
            with pytest.raises(KeyErased):
                store_of(e).get("two-spares", k)


def test_content_sealed_under_a_second_key_is_admitted_by_content(
        pair: tuple[HistoryEngine, HistoryEngine], raw: RawProducer, backend: KafkaBackend, tmp_path: Path) -> None:
    """The key store allows a second live key: a key record of a racing creator that crashed
    before tombstoning its own (engine/keys/kafka.py: the first key record wins ``create``, every
    live one still opens content). Records sealed under it are produced raw."""
    a, b = pair
    first = turn("two-keys", "a1", "under the first key")
    receipt = a.append(first)
    ((_, k1),) = keys_of(a, "two-keys")
    k2 = DataKey.generate()
    raw.add_key("two-keys", k2)
    before = counters(a)
    retry = raw.sealed_batch(first, k2)  # the identical batch under another key: a duplicate
    conflict = raw.sealed_batch(turn("two-keys", "a1", "different content"), k2)
    second = turn("two-keys", "a2", "new content under the second key")
    accepted = raw.sealed_batch(second, k2)
    for e in pair:
        for position in (retry, conflict, accepted):
            e.wait_applied(position, WAIT_S)
        delta = {k: v - before[k] for k, v in counters(e).items()}
        assert delta == {**dict.fromkeys(delta, 0), "duplicates": 1, "conflicts": 1, "accepted": 1}, delta
        assert e.read("two-keys") == [*first.messages, *second.messages]
        assert e.append(first) == receipt  # a retry through the engine: still the first receipt
        assert store_of(e).get("two-keys", k1).key_id == k1 and store_of(e).get("two-keys", k2.key_id) == k2
    assert observed(a) == observed(b)
    a.clear("two-keys")  # destroys both keys
    for e in pair:
        assert e.catch_up(timeout=WAIT_S)
        assert e.read("two-keys") == [] and keys_of(e, "two-keys") == []
    with backend.open(tmp_path / "rebuilt") as c:  # every record of the conversation is erased on replay
        assert c.read("two-keys") == [] and observed(c) == observed(a)
        assert counters(c)["erased"] == 4 and counters(c)["corrupt"] == 0


# -- 3. and 4. an instance behind an erasure; a rebuild after it ---------------------------------------
def lagging_scenario(backend: KafkaBackend, tmp_path: Path) -> tuple[HistoryEngine, list[str], list[Batch]]:
    """B sees c's first batch and closes; A appends tokens to c (and to other conversations) and
    clears c. Returns A (open), c's tokens and c's batches."""
    a = backend.open(tmp_path / "a")
    try:
        with backend.open(tmp_path / "b") as b:
            seen = a.append(turn("c", "a0", "before the tokens"))
            a.append(turn("other", "o0", "kept"))
            b.wait_applied(seen.position, WAIT_S)
        tokens = [token() for _ in range(3)]
        batches = [token_batch("c", f"t{i}", t) for i, t in enumerate(tokens)]
        for i, batch in enumerate(batches):
            a.append(batch)
            a.append(turn("other", f"o{i + 1}", f"kept {i}", tool=True))
        assert {t for t in tokens if files_holding(tmp_path / "a", [t.encode()])} == set(tokens)  # found before
        a.clear("c")
        assert a.read("c") == [] and a.entries("c") == []
        assert files_holding(tmp_path / "a", needles_of(tokens, batches)) == []  # when clear returned
        return a, tokens, [turn("c", "a0", "before the tokens"), *batches]
    except BaseException:
        a.close()
        raise


def test_an_instance_that_lagged_behind_an_erasure_ends_erased(backend: KafkaBackend, tmp_path: Path) -> None:
    a, tokens, batches = lagging_scenario(backend, tmp_path)
    with a:
        with backend.open(tmp_path / "b") as b:  # catches up with the appends and the clear
            assert_erased_and_closed(b)
            assert observed(b) == observed(a)
            assert b.read("other") == a.read("other") and len(b.read("other")) == 2 + 3 * 4
            sb = counters(b)
            assert sb["erased"] == len(tokens)  # the token batches it met after their key was destroyed
            assert sb["cleared"] == counters(a)["cleared"] == 1 and sb["corrupt"] == 0
            assert files_holding(tmp_path / "b", needles_of(tokens, batches[1:])) == []
        assert_erased_and_closed(a)
    for d in ("a", "b"):  # and after both closed, every byte of both state directories
        assert files_holding(tmp_path / d, needles_of(tokens, batches)) == [], d


def test_an_instance_rebuilt_after_the_erasure_equals_the_first(backend: KafkaBackend, tmp_path: Path) -> None:
    a, tokens, batches = lagging_scenario(backend, tmp_path)
    with a:
        with backend.open(tmp_path / "scratch") as c:  # a new state directory: a replay of the whole log
            assert_erased_and_closed(c)
            assert observed(c) == observed(a)
            sc, sa = counters(c), counters(a)
            assert sc["erased"] == len(batches)  # every batch of c, sealed under its destroyed key
            assert sc["accepted"] == sa["accepted"] - len(batches) and sc["cleared"] == sa["cleared"] == 1
            assert c.poison() == []
        assert files_holding(tmp_path / "scratch", needles_of(tokens, batches)) == []


def test_an_instance_that_applied_the_content_forgets_it_on_the_others_clear(
        pair: tuple[HistoryEngine, HistoryEngine], tmp_path: Path) -> None:
    a, b = pair
    tok = token()
    batch = token_batch("d", "t0", tok)
    receipt = a.append(batch)
    assert b.read("d", at_least=receipt) == list(batch.messages)  # B applied (and stored) the plaintext
    assert files_holding(tmp_path / "b", [tok.encode()]) != []  # the scan finds it (in B's WAL) before the clear
    a.clear("d")
    (clear_offset,) = [o for o, ev in conversation_records(a, "d") if isinstance(ev, ConversationCleared)]
    b.wait_applied(LogPosition(receipt.position.partition, clear_offset), WAIT_S)
    assert_erased_and_closed(b, "d")
    assert observed(a) == observed(b)
    assert files_holding(tmp_path / "b", needles_of([tok], [batch])) == []  # B's clear returned: erased


# -- 5. a clear racing appends ----------------------------------------------------------------------------
def test_a_clear_racing_appends_through_the_other_instance(pair: tuple[HistoryEngine, HistoryEngine],
                                                           backend: KafkaBackend, tmp_path: Path) -> None:
    """Four writers append to c through B until each has been refused three times; A clears c
    once the first appends have receipts."""
    a, b = pair
    writers, refusals = 4, 3
    cleared = threading.Event()
    outcomes: dict[tuple[int, int], Receipt | ConversationClosed] = {}
    tokens: dict[tuple[int, int], str] = {}
    batches: list[Batch] = []
    errors: list[BaseException] = []
    a.append(turn("kept", "k0", "not cleared"))

    def write(w: int) -> None:
        try:
            refused = 0
            deadline = time.monotonic() + WAIT_S
            for i in itertools.count():
                tokens[(w, i)] = tok = token()
                batch = token_batch("c", f"w{w}-{i}", tok)
                batches.append(batch)
                try:
                    outcomes[(w, i)] = b.append(batch)
                except ConversationClosed as exc:
                    outcomes[(w, i)] = exc
                    refused += 1
                    if refused == refusals:
                        return
                if time.monotonic() > deadline:
                    raise AssertionError(f"writer {w}: {i + 1 - refused} receipts and {refused} refusals in "
                                         f"{WAIT_S:g} s; the clear had {'' if cleared.is_set() else 'not '}returned")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    wait_until(lambda: len(outcomes) >= writers, "the first appends")  # the clear lands mid-stream
    a.clear("c")
    cleared.set()
    for t in threads:
        t.join(timeout=WAIT_S * 2)
    assert not errors and not any(t.is_alive() for t in threads), errors
    (clear_offset,) = [o for o, ev in conversation_records(a, "c") if isinstance(ev, ConversationCleared)]
    receipts = [o for o in outcomes.values() if isinstance(o, Receipt)]
    closed = [o for o in outcomes.values() if isinstance(o, ConversationClosed)]
    assert len(receipts) >= writers and len(closed) == writers * refusals
    assert all(r.position.offset < clear_offset for r in receipts)  # accepted before the clear
    for w in range(writers):  # per writer, once closed, closed
        seq = [isinstance(o, Receipt) for (ww, _), o in sorted(outcomes.items()) if ww == w]
        assert seq == sorted(seq, reverse=True), seq
    assert observed(a) == observed(b)
    for e in pair:
        assert_erased_and_closed(e)
        assert e.read("kept") == list(turn("kept", "k0", "not cleared").messages)
    # Outcomes per instance: each decides a record before the clear by its own key store, accepted,
    # or erased when its store already knew of the erasure (the first instance to apply the clear
    # writes the marker, whichever it is); a record after the clear is rejected as closed. B
    # answered its writers by its own decisions (a receipt where it accepted, ConversationClosed
    # where not), or by its pre-check once it knew c closed (no record).
    records = conversation_records(a, "c")
    before = [o for o, ev in records if o < clear_offset and isinstance(ev, BatchAppended)]
    after = [o for o, _ in records if o > clear_offset]
    ca, cb = counters(a), counters(b)
    for cx in (ca, cb):
        assert (cx["accepted"] + cx["erased"], cx["rejected_closed"], cx["cleared"]) == (1 + len(before), len(after), 1)
    assert cb["accepted"] == 1 + len(receipts)
    assert cb["erased"] + len(after) <= len(closed)
    print(f"\nclear racing appends: {len(receipts)} receipts before the clear, {len(closed)} ConversationClosed "
          f"({cb['erased']} records before the clear that B met after its store learnt of the erasure, "
          f"{len(after)} records after the clear, {len(closed) - cb['erased'] - len(after)} refused by the "
          f"pre-check); erased on A: {ca['erased']}")
    with backend.open(tmp_path / "scratch") as c:
        assert_erased_and_closed(c)
        assert observed(c) == observed(a)
        cc = counters(c)
        assert (cc["accepted"], cc["erased"], cc["rejected_closed"]) == (1, len(before), len(after))
    needles = needles_of(tokens.values(), batches)
    for d in ("a", "b", "scratch"):
        assert files_holding(tmp_path / d, needles) == [], d


@pytest.mark.parametrize("b_saw_the_marker", [True, False])
def test_a_record_before_the_clear_decided_by_an_instance_behind_it(
        pair: tuple[HistoryEngine, HistoryEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        b_saw_the_marker: bool) -> None:
    """The interleaving the race above meets by chance, forced: B's projector is held just before
    it opens B's own record X (B's writer waits for its decision) until A has applied X and its
    clear; then B's key store either has caught up with A's erasure marker (X is erased on B: its
    writer gets ConversationClosed) or still holds the key in memory (X is accepted on B: a
    receipt from before the clear, then B applies the clear). Either way both end erased and equal;
    A, which applied X before its own clear, accepted it."""
    a, b = pair
    store, real_get = store_of(b), store_of(b).get
    held, release = threading.Event(), threading.Event()

    def get(conv: str, key_id: str) -> DataKey:
        if conv == "c" and not held.is_set():
            held.set()
            assert release.wait(WAIT_S), "the test never released the projector"
        return real_get(conv, key_id)

    monkeypatch.setattr(store, "get", get)
    tok = token()
    x = token_batch("c", "x", tok)
    outcome: list[Receipt | ConversationClosed | BaseException] = []

    def write() -> None:
        try:
            outcome.append(b.append(x))
        except Exception as exc:  # ConversationClosed is expected; anything else fails below
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert held.wait(WAIT_S), "B's projector never opened X"
        a.clear("c")  # A applies X, then the clear, and destroys the key
        if b_saw_the_marker:
            assert store.erased("c")  # B's store catches up with the marker (a create of B's would too)
        else:
            assert store.list_keys("c") != []  # not caught up: the key is still in B's memory
    finally:
        release.set()
        writer.join(WAIT_S)
    assert not writer.is_alive()
    ((x_offset, _), (clear_offset, cleared)) = conversation_records(a, "c")
    assert isinstance(cleared, ConversationCleared) and x_offset < clear_offset
    (got,) = outcome
    if b_saw_the_marker:
        assert isinstance(got, ConversationClosed), got
    else:
        assert isinstance(got, Receipt) and got.position.offset == x_offset, got
    assert observed(a) == observed(b)
    for e in pair:
        assert_erased_and_closed(e)
    ca, cb = counters(a), counters(b)
    assert (ca["accepted"], ca["erased"], ca["cleared"]) == (1, 0, 1)
    assert (cb["accepted"], cb["erased"], cb["cleared"]) == ((0, 1, 1) if b_saw_the_marker else (1, 0, 1))
    for d in ("a", "b"):
        assert files_holding(tmp_path / d, needles_of([tok], [x])) == [], d
