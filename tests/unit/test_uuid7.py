"""UUIDv7 (RFC 9562): layout, time, monotonicity within a process."""

from __future__ import annotations

import itertools
import time
import uuid

from engine import uuid7


def test_layout_is_version_7_variant_rfc_with_the_unix_milliseconds_first() -> None:
    before = time.time_ns() // 1_000_000
    u = uuid7()
    after = time.time_ns() // 1_000_000
    assert isinstance(u, uuid.UUID) and u.version == 7 and u.variant == uuid.RFC_4122
    assert before <= u.int >> 80 <= after + 1  # +1: a same-millisecond overflow may move on by one


def test_ids_are_strictly_increasing_and_unique_within_a_process() -> None:
    ids = [uuid7() for _ in range(20_000)]  # many share a millisecond
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert len({str(u) for u in ids}) == len(ids)


def test_the_random_bits_differ_between_milliseconds() -> None:
    first = uuid7()
    while uuid7().int >> 80 == first.int >> 80:  # spin into the next millisecond (no sleeping)
        pass
    later = uuid7()
    assert (first.int & ((1 << 62) - 1)) != (later.int & ((1 << 62) - 1))
