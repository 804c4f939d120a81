"""Erasure holds on a standby replica (issue 48): a standby applies a clear like an owner, so a
cleared conversation's content leaves the standby's files too, before it is ever promoted, and
once promoted it serves the conversation erased and closed. Two engines on one real Kafka topic:
``a`` owns every partition, ``b`` owns none and keeps them all as standbys."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import NotOwner
from schemas.records import partition_for_key, record_key
from tests.integration.erasure_support import (
    WAIT_S,
    assert_erased_and_closed,
    files_holding,
    needles_of,
    observed,
    token,
    token_batch,
)

pytestmark = pytest.mark.kafka
PARTITIONS = 2


@pytest.fixture(autouse=True)
def _no_master_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HISTLOG_MASTER_KEY_FILE", raising=False)


def test_a_standby_erases_a_cleared_conversation_from_its_files(kafka_bootstrap: str, kafka_topic: str,
                                                               tmp_path: Path) -> None:
    def open_(state: str, owned: list[int] | None) -> HistoryEngine:
        return HistoryEngine.open(kafka=kafka_bootstrap, topic=kafka_topic, state_dir=tmp_path / state,
                                  partitions=PARTITIONS, owned=owned)

    with open_("a", None) as a, open_("b", []) as b:
        b.add_standbys(range(PARTITIONS))
        tok, kept = token(), token()
        secret = token_batch("d", "t0", tok)
        other = token_batch("e", "t0", kept)
        a.append(secret)
        a.append(other)
        assert b.catch_up(timeout=WAIT_S, standbys=True)
        assert b.applied_offsets() == a.applied_offsets()  # the standby applied both
        with pytest.raises(NotOwner):
            b.read("d")

        a.clear("d")
        assert b.catch_up(timeout=WAIT_S, standbys=True)  # waits for its erasure's compaction too
        assert files_holding(tmp_path / "b", needles_of([tok], [secret])) == []

        b.assign(range(PARTITIONS))  # promoted where it stands
        assert b.catch_up(timeout=WAIT_S)
        p = partition_for_key(record_key("d"), PARTITIONS)
        assert b.stats().owned_partitions == list(range(PARTITIONS)) and p in b.owned
        assert_erased_and_closed(b, "d")
        assert b.read("e") == list(other.messages)
        assert observed(a) == observed(b)
