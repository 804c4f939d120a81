"""The facade, reads and turns conformance suites over the wire: ``HistoryClient`` -> a real
uvicorn server on loopback -> the embedded engine (``OverHTTP``), so the service is proven by the
same contract as the engine.

Left out, each for a feature the client does not offer because it is in-process only:
* custom projections (``register``, ``view``, ``rebuild``): ``ProjectionContract`` is not run and
  ``test_custom_projections_see_each_accepted_replacement_once`` is skipped;
* writing raw records to the log (``engine.log``, ``catch_up``):
  ``test_malformed_replacements_on_the_log_are_poison_on_every_replay`` is skipped;
* ``test_bad_arguments_raise_invalid_window_before_any_io`` counts the engine's key reads around
  ``stats()``, which over HTTP reads keys itself; the same rule over HTTP (no request is sent)
  is ``test_client_retries.py::test_bad_arguments_send_no_request``.
Hypothesis runs fewer examples than in-process (every operation is an HTTP round trip).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.backends import OverAsyncHTTP, OverHTTP
from tests.conformance.facade_contract import FacadeContract
from tests.conformance.reads_contract import ReadsContract
from tests.conformance.turns_contract import TurnsContract

_IN_PROCESS = "in-process only: custom projections (register/view/rebuild) are not offered over HTTP"
_RAW_LOG = "in-process only: writes raw records to the engine's log (engine.log, catch_up)"
_KEYS_AROUND_STATS = ("counts the served engine's key reads around stats(), and GET /v1/stats reads the poison "
                      "keyspace itself; over HTTP the rule is checked by sending no request at all "
                      "(test_client_retries.py::test_bad_arguments_send_no_request)")


class TestFacadeOverHTTP(OverHTTP, FacadeContract):
    pass


class TestFacadeOverAsyncHTTP(OverAsyncHTTP, FacadeContract):
    """The asyncio client, every call awaited on its own loop."""


class TestReadsOverHTTP(OverHTTP, ReadsContract):
    examples = 10


    @pytest.mark.skip(reason=_KEYS_AROUND_STATS)
    def test_bad_arguments_raise_invalid_window_before_any_io(self, *args: Any, **kwargs: Any) -> None: ...


class TestReadsOverAsyncHTTP(OverAsyncHTTP, ReadsContract):
    """The asyncio client on the read contract (reads by ids and clear_prefix among them)."""

    examples = 4

    @pytest.mark.skip(reason=_KEYS_AROUND_STATS)
    def test_bad_arguments_raise_invalid_window_before_any_io(self, *args: Any, **kwargs: Any) -> None: ...


class TestTurnsOverHTTP(OverHTTP, TurnsContract):
    max_examples = 8


    @pytest.mark.skip(reason=_IN_PROCESS)
    def test_custom_projections_see_each_accepted_replacement_once(self, *args: Any, **kwargs: Any) -> None: ...

    @pytest.mark.skip(reason=_RAW_LOG)
    def test_malformed_replacements_on_the_log_are_poison_on_every_replay(self, *args: Any, **kwargs: Any) -> None: ...
