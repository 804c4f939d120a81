"""How admission counters compare with a rebuild once conversations were erased.

Counters count the decisions *this state* made. A state rebuilt after a ``clear`` meets the
cleared conversation's sealed records with their key destroyed and counts each of them as
``erased`` instead of the outcome the original state gave it (accepted, a duplicate, a conflict,
a refused precondition or replacement). Everything else (``corrupt``, ``rejected_closed``,
``cleared``) and the number of records counted are the same. Without clears the counters are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

ERASABLE = ("accepted", "duplicates", "conflicts", "precondition_failed", "not_replaceable")
"""The outcomes a rebuild may count as ``erased`` instead."""
KEPT = ("corrupt", "rejected_closed", "cleared")
"""The outcomes a rebuild counts exactly as the state it replaces."""


def _counts(stats: Any) -> Mapping[str, int]:
    return asdict(stats) if is_dataclass(stats) else stats  # type: ignore[arg-type]


def assert_rebuilt_counts(live: Any, rebuilt: Any) -> None:
    """``rebuilt`` (counters of a state rebuilt from the log) agrees with ``live`` as the module says."""
    a, b = _counts(live), _counts(rebuilt)
    for name in KEPT:
        assert b[name] == a[name], (name, a, b)
    moved = 0
    for name in ERASABLE:
        assert b[name] <= a[name], (name, a, b)
        moved += a[name] - b[name]
    assert b["erased"] - a["erased"] == moved, ("every record the rebuild counts as erased", a, b)


def comparable_counts(stats: Mapping[str, Any]) -> dict[str, Any]:
    """``stats`` with the erasable counters and ``erased`` folded into one total (equal for a
    state and its rebuild); the other entries as they are."""
    out = {k: v for k, v in stats.items() if k not in ERASABLE and k != "erased"}
    out["erasable_or_erased"] = sum(stats[k] for k in ERASABLE) + stats["erased"]
    return out
