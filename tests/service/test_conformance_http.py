"""The facade, reads and turns conformance suites over the wire: ``HistoryClient`` -> a real
uvicorn server on loopback -> the embedded engine (``OverHTTP``), so the service is proven by the
same contract as the engine.

Left out, each for a feature the client does not offer because it is in-process only:
* custom projections (``register``, ``view``, ``rebuild``): ``ProjectionContract`` is not run and
  ``test_custom_projections_see_each_accepted_replacement_once`` is skipped;
* writing raw records to the log (``engine.log``, ``catch_up``):
  ``test_malformed_replacements_on_the_log_are_poison_on_every_replay`` is skipped.
Hypothesis runs fewer examples than in-process (every operation is an HTTP round trip).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.backends import OverHTTP
from tests.conformance.facade_contract import FacadeContract
from tests.conformance.reads_contract import ReadsContract
from tests.conformance.turns_contract import TurnsContract

_IN_PROCESS = "in-process only: custom projections (register/view/rebuild) are not offered over HTTP"
_RAW_LOG = "in-process only: writes raw records to the engine's log (engine.log, catch_up)"


class TestFacadeOverHTTP(OverHTTP, FacadeContract):
    pass


class TestReadsOverHTTP(OverHTTP, ReadsContract):
    examples = 10


class TestTurnsOverHTTP(OverHTTP, TurnsContract):
    max_examples = 8

    @pytest.mark.skip(reason=_IN_PROCESS)
    def test_custom_projections_see_each_accepted_replacement_once(self, engine: Any) -> None: ...

    @pytest.mark.skip(reason=_RAW_LOG)
    def test_malformed_replacements_on_the_log_are_poison_on_every_replay(self, backend: Any) -> None: ...
