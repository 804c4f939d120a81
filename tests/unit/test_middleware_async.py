"""What only the asyncio face has: the store runs off the event loop, and cancellation.

Every behaviour the two faces share is specified once, for both, in test_middleware.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import Batch, ChatDelta, ChatRequest, ChatResponse, Message, Receipt, TextDelta
from tests.unit.middleware_support import SYSTEM, SpyModel, SpyStore, middleware

CONV = "support-4711"
BOUND = 10.0  # fail-safe bound on blocking waits; the tests never rely on it elapsing


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data") as eng:
        yield eng


def ask(text: str = "Where is A1042?") -> ChatRequest:
    return ChatRequest([SYSTEM, Message.user(text)])


def answer(text: str = "It arrives tomorrow.") -> ChatResponse:
    return ChatResponse(Message.assistant(text), "stop")


class BlockingStore(SpyStore):
    """Its read or append waits (in the worker thread) until the test releases it."""

    def __init__(self, engine: HistoryEngine, *, block: str) -> None:
        super().__init__(engine)
        self.block = block
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def _hold(self, what: str) -> None:
        if what == self.block:
            self.entered.set()
            assert self.release.wait(BOUND), f"{what} was never released"

    def read(self, conversation_id: str) -> list[Message]:
        self._hold("read")
        return super().read(conversation_id)

    def append(self, batch: Batch) -> Receipt:
        self._hold("append")
        try:
            return super().append(batch)
        finally:
            self.finished.set()


def test_reads_and_appends_run_in_worker_threads_not_on_the_loop(engine: HistoryEngine) -> None:
    store = SpyStore(engine)

    async def main() -> int:
        await middleware(store).acall(SpyModel(answer()).acall)(ask())
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert len(store.threads) == 2 and loop_thread not in store.threads


def test_the_loop_keeps_running_while_a_read_blocks(engine: HistoryEngine) -> None:
    store = BlockingStore(engine, block="read")

    async def main() -> ChatResponse:
        call = asyncio.ensure_future(middleware(store).acall(SpyModel(answer()).acall)(ask()))
        await asyncio.to_thread(store.entered.wait, BOUND)
        store.release.set()  # runs only because the read is not blocking the loop
        return await call

    assert asyncio.run(main()) == answer()
    assert engine.read(CONV)[-1] == answer().message


def test_cancelling_during_the_read_saves_nothing_and_skips_the_model(engine: HistoryEngine) -> None:
    store, model = BlockingStore(engine, block="read"), SpyModel(answer())

    async def main() -> None:
        call = asyncio.ensure_future(middleware(store).acall(model.acall)(ask()))
        await asyncio.to_thread(store.entered.wait, BOUND)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        store.release.set()

    asyncio.run(main())
    assert model.calls == 0 and store.appends == [] and engine.read(CONV) == []


def test_cancelling_while_the_model_runs_saves_nothing(engine: HistoryEngine) -> None:
    store = SpyStore(engine)

    async def main() -> None:
        started, never = asyncio.Event(), asyncio.Event()

        async def slow_model(request: ChatRequest) -> ChatResponse:
            started.set()
            await never.wait()
            return answer()

        call = asyncio.ensure_future(middleware(store).acall(slow_model)(ask()))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
    assert store.reads == 1 and store.appends == [] and engine.read(CONV) == []


def test_cancelling_a_stream_consumer_closes_upstream_and_saves_nothing(engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    closed: list[bool] = []

    async def main() -> list[ChatDelta]:
        first, never = asyncio.Event(), asyncio.Event()
        got: list[ChatDelta] = []

        async def upstream(request: ChatRequest) -> AsyncGenerator[ChatDelta, None]:
            try:
                yield ChatDelta([TextDelta("It arrives")])
                await never.wait()
                yield ChatDelta(finish_reason="stop")
            finally:
                closed.append(True)

        async def consume() -> None:
            async for delta in middleware(store).astream(upstream)(ask()):
                got.append(delta)
                first.set()

        task = asyncio.ensure_future(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return got

    assert len(asyncio.run(main())) == 1
    assert closed == [True] and store.appends == [] and engine.read(CONV) == []


def test_a_cancellation_during_an_in_flight_append_takes_effect_once_it_is_decided(engine: HistoryEngine) -> None:
    """The documented guarantee: an append that started cannot be recalled; the task waits for it
    to be decided, then raises CancelledError with a note; nothing is left running behind it."""
    store = BlockingStore(engine, block="append")

    async def main() -> None:
        call = asyncio.ensure_future(middleware(store).acall(SpyModel(answer()).acall)(ask(), append_id="turn-1"))
        await asyncio.to_thread(store.entered.wait, BOUND)
        call.cancel()
        for _ in range(20):  # give the cancellation every chance to end the task early
            await asyncio.sleep(0)
        assert not call.done(), "the task ended while its append was still in flight"
        store.release.set()
        with pytest.raises(asyncio.CancelledError) as info:
            await call
        assert store.finished.is_set()
        assert any("may be stored" in note for note in getattr(info.value, "__notes__", []))

    asyncio.run(main())
    assert [b.append_id for b in store.appends] == ["turn-1"]
    assert engine.read(CONV) == [Message.user("Where is A1042?"), answer().message]
