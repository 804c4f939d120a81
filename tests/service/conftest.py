"""Fixtures of the service tests: a FileLog engine in a temporary directory, served over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from tests.service.server_support import serving


@dataclass(frozen=True)
class Served:
    """A running server (``url``: ``http://127.0.0.1:PORT``) over ``engine``."""

    url: str
    engine: HistoryEngine

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data") as eng:
        yield eng


@pytest.fixture
def served(engine: HistoryEngine) -> Iterator[Served]:
    """A real uvicorn server on 127.0.0.1 over a fresh FileLog engine (no token)."""
    with serving(engine) as url:
        yield Served(url, engine)
