"""The fault harness of test_fault_model.py plus damage to the RocksDB state while the engine
is down (truncated .sst, missing CURRENT or MANIFEST, garbage in a state file, flipped bytes
in an .sst index block): opening a damaged state must rebuild it from the log (docs/design.md §7,
issue 11 defect 5), and the rebuilt state must equal the one before the damage.

Switched off by ``STATE_DAMAGE = False`` in test_fault_model.py.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.reliability.fault_checks import comparable
from tests.reliability.fault_process import WorkerDied, Zygote
from tests.reliability.test_fault_model import OPEN_CONVS, STATE_DAMAGE, FaultModel, fault_stats, run

pytestmark = pytest.mark.skipif(not STATE_DAMAGE, reason="state damage rules are switched off (STATE_DAMAGE)")


def state_files(state: Path, pattern: str) -> list[Path]:
    return sorted(p for p in state.glob(pattern) if p.is_file())


class DamageFaultModel(FaultModel):
    """The same machine plus damage to the RocksDB state while the engine is down: opening a
    state that is damaged must rebuild it from the log (docs/design.md §7), and the rebuilt state
    must equal the one before the damage. It also expects the other state fixes of issue 11:
    an open removes the scratch states a killed open left behind (defect 8)."""

    expect_no_scratch = True

    def damage(self, what: str, harm: Callable[[Path], bool]) -> None:
        self.begin()
        self.worker.value({"op": "flush"})
        before = comparable(self.observe())
        self.worker.kill()
        if not harm(self.data / "state"):
            fault_stats[f"damage {what}: nothing to damage"] += 1
            self.restart()
            return
        fault_stats[f"damage {what}"] += 1
        try:
            self.restart()
        except (AssertionError, WorkerDied) as e:
            raise AssertionError(f"after damage ({what}) the engine did not rebuild its state: {e}") from e
        got = self.worker.request({"op": "observe", "convs": [m.cid for m in self.convs]})
        if got.get("error") == "DamagedState":
            # Damage that opening could not see, found by a read: the documented way out is a reopen.
            fault_stats[f"damage {what}: found by a read, rebuilt by a reopen"] += 1
            self.worker.kill()
            self.restart()
        assert comparable(self.observe()) == before, f"after damage ({what}) the rebuilt state differs"

    @rule(seed=st.integers(0, 1000))
    def truncate_sst(self, seed: int) -> None:
        def harm(state: Path) -> bool:
            ssts = state_files(state, "*.sst")
            if not ssts:
                return False
            victim = random.Random(seed).choice(ssts)
            os.truncate(victim, victim.stat().st_size // 2)
            return True
        self.damage("truncated .sst", harm)

    @rule()
    def delete_current(self) -> None:
        def harm(state: Path) -> bool:
            (state / "CURRENT").unlink()
            return True
        self.damage("CURRENT deleted", harm)

    @rule()
    def delete_manifest(self) -> None:
        def harm(state: Path) -> bool:
            for p in state_files(state, "MANIFEST-*"):
                p.unlink()
            return True
        self.damage("MANIFEST deleted", harm)

    @rule(pattern=st.sampled_from(["*.sst", "MANIFEST-*", "CURRENT", "OPTIONS-*"]), seed=st.integers(0, 1000))
    def garbage(self, pattern: str, seed: int) -> None:
        def harm(state: Path) -> bool:
            files = state_files(state, pattern)
            if not files:
                return False
            rng = random.Random(seed)
            victim = rng.choice(files)
            size = victim.stat().st_size
            with victim.open("r+b") as f:
                f.seek(rng.randrange(max(size, 1)))
                f.write(rng.randbytes(64))
            return True
        self.damage(f"garbage in {pattern}", harm)


    @rule()
    def damage_sst_index(self) -> None:
        """Flip bytes near the end of the newest .sst (its index and meta blocks): RocksDB finds
        it while opening, with a message about a "block checksum mismatch"."""
        def harm(state: Path) -> bool:
            ssts = state_files(state, "*.sst")
            if not ssts:
                return False
            raw = bytearray(ssts[-1].read_bytes())
            for i in range(max(len(raw) - 200, 0), max(len(raw) - 120, 0)):
                raw[i] ^= 0xFF
            ssts[-1].write_bytes(bytes(raw))
            return True
        self.damage("flipped bytes in an .sst index block", harm)


    @rule()
    def damage_sst_data_block(self) -> None:
        """Flip bytes at the start of the oldest .sst (its first data block): RocksDB opens it
        fine; the first read of that block fails its checksum."""
        def harm(state: Path) -> bool:
            ssts = state_files(state, "*.sst")
            if not ssts:
                return False
            raw = bytearray(ssts[0].read_bytes())
            for i in range(16, min(48, len(raw))):
                raw[i] ^= 0xFF
            ssts[0].write_bytes(bytes(raw))
            return True
        self.damage("flipped bytes in an .sst data block", harm)


def test_a_damaged_state_is_rebuilt_from_the_log() -> None:
    run(DamageFaultModel)
    assert any(k.startswith("damage") and "nothing" not in k for k in fault_stats), "no damage was exercised"


DAMAGES: list[tuple[str, dict[str, Any]]] = [
    ("truncate_sst", {"seed": 0}), ("delete_current", {}), ("delete_manifest", {}), ("damage_sst_index", {}),
    ("damage_sst_data_block", {}),
    ("garbage", {"pattern": "*.sst", "seed": 0}), ("garbage", {"pattern": "MANIFEST-*", "seed": 0}),
    ("garbage", {"pattern": "CURRENT", "seed": 0}), ("garbage", {"pattern": "OPTIONS-*", "seed": 0})]


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


@pytest.mark.parametrize(("damage", "args"), DAMAGES, ids=[f"{d}-{a.get('pattern', '')}" for d, a in DAMAGES])
def test_each_state_damage_is_rebuilt_from_the_log(zygote: Zygote, damage: str, args: dict[str, Any]) -> None:
    """Every damage rule once, on a fixed history (replacement, clear, flushed .sst files), so
    each runs in every CI run whatever the search above picks."""
    fault_stats.clear()
    DamageFaultModel.zygote = zygote
    m = DamageFaultModel()
    try:
        for i in range(6):
            m.append(pick=i % OPEN_CONVS, aid=f"a{i}", shape="turn", variant=0, precondition="none")
        m.replace_turn(pick=0, aid="a9", variant=1, which="latest", reason="retry", same_user=True)
        m.clear(pick=1)
        m.flush()
        m.reopen(clean=True)
        m.agrees_with_the_model()
        getattr(m, damage)(**args)
        m.agrees_with_the_model()
        assert [k for k in fault_stats if k.startswith("damage")] and \
            not [k for k in fault_stats if "nothing to damage" in k], fault_stats
    finally:
        m.teardown()
