"""The erasure benchmark compares like with like: both engines run every case in every round,
in alternating order, every append is accepted and every clear erases, and the ratios and the
README table are the measured numbers (a tiny run: performance itself is never asserted)."""

from __future__ import annotations

from bench import NAMES
from bench import bench_erasure as be


def test_rounds_alternate_which_engine_goes_first() -> None:
    assert [be._order(r) for r in range(4)] == [(True, False), (False, True)] * 2


def test_spread_is_the_median_min_and_max() -> None:
    assert be.spread([0.9, 1.2, 1.0]) == {"median": 1.0, "min": 0.9, "max": 1.2}


def test_a_tiny_run_measures_every_case_for_both_engines() -> None:
    sizes = be.Sizes(rounds=2, appends={1: 4, 4: 8}, replay_records=200, clear_conversations=32, clears_per_round=3)
    result = be.run(progress=False, sizes=sizes)
    assert [(a["shape"], a["writers"]) for a in result["appends"]] == [
        (shape, writers) for shape in ("new", "turns10", "reused") for writers in (1, 4)]
    for a in result["appends"]:
        assert len(a["rounds"]) == 2
        for r in a["rounds"]:
            assert r["sealed_per_s"] > 0 and r["plain_per_s"] > 0 and r["sealed_cpu_us"] > 0
            # The ratio is of the two rates of the same round (rounded rates: within a rounding error).
            assert abs(r["rate_ratio"] - r["sealed_per_s"] / r["plain_per_s"]) < 0.01 * r["rate_ratio"] + 0.002
            assert r["sealed_appends_per_fsync"] >= 1 and r["plain_appends_per_fsync"] >= 1  # read from the log
        ratios = [r["rate_ratio"] for r in a["rounds"]]
        assert a["rate_ratio"]["min"] == min(ratios) and a["rate_ratio"]["max"] == max(ratios)
    assert result["replay"]["records"] == 200 and len(result["replay"]["rounds"]) == 2
    assert result["clear"]["clears"] == 6  # 3 per round, each a different conversation
    parts = result["components"]
    assert parts["key_create_new_us"] > 0 and parts["key_refill_us"] > parts["key_lookup_us"]  # an fsync
    situ = result["in_situ"]
    assert situ["writers"] == 4 and situ["sealed_seal_event_us"] > 0 and situ["sealed_keys.get_us"] > 0
    # The projector admits the engine's own records from what it encoded: no decode, no open.
    assert "sealed_open_content_us" not in situ and "sealed_decode_event_us" not in situ
    assert "plain_seal_event_us" not in situ and situ["plain_encode_event_us"] > 0  # plain never seals
    table = be.markdown(result).splitlines()
    assert len(table) == 2 + 6 + 2  # header, rule, six append rows, replay, clear
    assert "| appends/s, 4 writers, new conversation each |" in table[3]
    assert be.report(result).count("\n") >= 8


def test_it_is_registered_with_the_others() -> None:
    assert "erasure" in NAMES


def test_the_warm_up_reaches_every_key_store_bucket() -> None:
    from engine.keys.files import BUCKETS, bucket_of

    warm = be._warm_conversations()
    assert sorted(bucket_of(c) for c in warm) == list(range(BUCKETS))
