"""Each refusal that used to be a bare ``HistoryError`` raises its own type (schemas/errors.py),
still a ``HistoryError``, with a message that says what to do next. Real engines, real FileLogs;
the Kafka refusals that need a broker are in tests/integration/test_kafka_topic.py."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

import projections.runtime as runtime
from engine import HistoryEngine
from engine.log.kafka_topic import check_topic_configs
from engine.log.memory import MemoryLog
from projections import BatchEvent, ProjectedEvent, Projection, ProjectionTx
from schemas import errors
from schemas.errors import (
    DuplicateProjection,
    EngineClosed,
    HistoryError,
    InvalidConfiguration,
    InvalidProjection,
    LogUnavailable,
    ProjectionError,
    TopicRefused,
)
from tests.conformance.facade_contract import turn

NEW = [TopicRefused, InvalidProjection, DuplicateProjection, ProjectionError, EngineClosed]


class Counter(Projection):
    name = "counter"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        tx.put(b"n", str(int(tx.get(b"n") or b"0") + 1).encode())


class Failing(Projection):
    name = "failing"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if isinstance(event, BatchEvent):
            raise RuntimeError("apply broke")


def _named(name: object) -> Projection:
    cls = type("Named", (Counter,), {"name": name})
    return cls()  # type: ignore[no-any-return]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "d", fsync="never") as eng:
        yield eng


@pytest.mark.parametrize("cls", NEW)
def test_every_new_error_is_a_history_error_exported_and_picklable(cls: type[HistoryError]) -> None:
    import engine as engine_pkg
    import schemas

    assert issubclass(cls, HistoryError)
    assert cls.__name__ in schemas.__all__ and cls.__name__ in engine_pkg.__all__
    assert cls.__name__ in errors.__all__ and cls.__name__ in (errors.__doc__ or "")
    again = pickle.loads(pickle.dumps(cls("what happened; what to do")))
    assert type(again) is cls and str(again) == "what happened; what to do"


def test_bad_settings_stay_value_errors() -> None:
    """``except InvalidConfiguration`` / ``except ValueError`` keep catching the bad-setting refusals."""
    assert issubclass(TopicRefused, InvalidConfiguration) and issubclass(TopicRefused, ValueError)
    assert issubclass(DuplicateProjection, InvalidProjection) and issubclass(InvalidProjection, ValueError)
    assert not issubclass(ProjectionError, ValueError) and not issubclass(EngineClosed, ValueError)


def test_a_closed_engine_raises_engine_closed(tmp_path: Path) -> None:
    eng = HistoryEngine.open(tmp_path / "d")
    eng.close()
    for call in (lambda: eng.read("c"), lambda: eng.append(turn("c", "a", "x")), lambda: eng.register(Counter())):
        with pytest.raises(EngineClosed, match=r"closed; open a new one \(HistoryEngine\.open\)"):
            call()


def test_registering_what_is_not_a_projection_raises_invalid_projection(engine: HistoryEngine) -> None:
    with pytest.raises(InvalidProjection, match=r"takes a projections\.Projection, not object"):
        engine.register(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "says"), [
    ("", "non-empty str `name`"),
    (None, "non-empty str `name`"),
    ("a\x00b", "no control characters"),
    ("x" * 201, "at most 200 UTF-8 bytes"),
    ("core", "reserved; choose another"),
])
def test_a_bad_projection_name_raises_invalid_projection(engine: HistoryEngine, name: object, says: str) -> None:
    with pytest.raises(InvalidProjection, match=says):
        engine.register(_named(name))


def test_a_second_projection_with_a_taken_name_raises_duplicate_projection(engine: HistoryEngine) -> None:
    first = Counter()
    engine.register(first)
    engine.register(first)  # the same object again: nothing to do
    with pytest.raises(DuplicateProjection, match="'counter' is already registered; choose another name"):
        engine.register(Counter())


def test_a_failing_apply_raises_projection_error_at_catch_up_and_at_view(engine: HistoryEngine) -> None:
    engine.append(turn("c", "a", "x"))
    with pytest.raises(ProjectionError, match=r"'failing' failed at .*fix it and register it again") as info:
        engine.register(Failing())
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ProjectionError, match=r"'failing' stopped after an error .*register\(\) it again"):
        engine.view("failing")


def test_a_log_without_the_applied_records_raises_log_unavailable(engine: HistoryEngine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Catch-up replays records the state says were applied; a log (here an empty real
    MemoryLog) that does not have them is unavailable, not a bare HistoryError."""
    engine.append(turn("c", "a", "x"))
    monkeypatch.setattr(runtime, "_EMPTY_READS", 0)  # give up at the first empty read, not after ~10 s
    with MemoryLog(engine.log.partitions) as empty, \
            pytest.raises(LogUnavailable, match=r"no records at 0:0 .*is the log reachable"):
        engine._projector.register(Counter(), empty.read)


@pytest.mark.parametrize("configs", [
    {"retention.ms": "86400000"},
    {"retention.ms": "-1", "retention.bytes": "1073741824"},
    {"retention.ms": "-1", "cleanup.policy": "compact"},
])
def test_a_topic_that_loses_history_raises_topic_refused(configs: dict[str, str]) -> None:
    with pytest.raises(TopicRefused, match=r"refusing Kafka topic 't'.* fix: .*--alter"):
        check_topic_configs("t", configs, "h:9092")



class OtherCounter(Counter):
    """Same name as ``Counter``, other rule: counts by ten."""

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        tx.put(b"n", str(int(tx.get(b"n") or b"0") + 10).encode())


def test_a_refused_duplicate_leaves_the_live_projection_in_place(engine: HistoryEngine) -> None:
    """The refused object must not take the name over: ``rebuild`` replays the live projection."""
    engine.append(turn("c", "a", "x"))
    engine.register(Counter())
    with pytest.raises(DuplicateProjection):
        engine.register(OtherCounter())
    engine.rebuild("counter")
    assert engine.view("counter").get(b"n") == b"1"
