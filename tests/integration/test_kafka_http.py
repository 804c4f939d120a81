"""The facade, reads and turns conformance suites over the wire on a real broker:
``HistoryClient`` -> a uvicorn server on loopback -> an engine on Kafka (``OverHTTPOnKafka``):
the service proven by the same contract as the engine on its second backend. The same tests are
left out as over the embedded engine (tests/service/test_conformance_http.py says why), with
fewer hypothesis examples (every operation is an HTTP round trip and a broker write)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.backends import OverHTTPOnKafka
from tests.conformance.facade_contract import FacadeContract
from tests.conformance.reads_contract import ReadsContract
from tests.conformance.turns_contract import TurnsContract
from tests.service.test_conformance_http import _IN_PROCESS, _KEYS_AROUND_STATS, _RAW_LOG

pytestmark = pytest.mark.kafka


class TestFacadeOverHTTPOnKafka(OverHTTPOnKafka, FacadeContract):
    partitions = 2


class TestReadsOverHTTPOnKafka(OverHTTPOnKafka, ReadsContract):
    examples = 6

    @pytest.mark.skip(reason=_KEYS_AROUND_STATS)
    def test_bad_arguments_raise_invalid_window_before_any_io(self, *args: Any, **kwargs: Any) -> None: ...


class TestTurnsOverHTTPOnKafka(OverHTTPOnKafka, TurnsContract):
    max_examples = 6
    partitions = 2

    @pytest.mark.skip(reason=_IN_PROCESS)
    def test_custom_projections_see_each_accepted_replacement_once(self, *args: Any, **kwargs: Any) -> None: ...

    @pytest.mark.skip(reason=_RAW_LOG)
    def test_malformed_replacements_on_the_log_are_poison_on_every_replay(self, *args: Any, **kwargs: Any) -> None: ...
