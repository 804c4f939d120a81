"""``/metrics`` over a real server: the series after traffic, route templates (never a
conversation id in a label), the token, one registry per app, lag in seconds."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.facade import HistoryEngine
from engine.service.health import observability
from engine.service.metrics import EngineCollector
from tests.service.server_support import serving

SECRET = "conv-secret-4711"
APPEND_ROUTE = "/v1/conversations/{c}/appends/{a}"


def _body(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "parts": [{"kind": "text", "text": text}]}]}


@pytest.fixture
def url(engine: HistoryEngine) -> Iterator[str]:
    obs = observability(engine)
    with serving(engine, token="tok", **obs.app_options()) as base:
        yield base
        obs.close()


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def _traffic(url: str) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer tok"}, timeout=10) as c:
        assert c.put(f"/v1/conversations/{SECRET}/appends/a1", json=_body("hi")).status_code == 200
        assert c.put(f"/v1/conversations/{SECRET}/appends/a1", json=_body("hi")).status_code == 200  # duplicate
        assert c.put(f"/v1/conversations/{SECRET}/appends/a1", json=_body("other")).status_code == 409
        assert c.get(f"/v1/conversations/{SECRET}/messages").status_code == 200
        assert c.delete(f"/v1/conversations/{SECRET}-2").status_code == 204
        assert c.put(f"/v1/conversations/{SECRET}-2/appends/a2", json=_body("late")).status_code == 410
        assert c.get(f"/v1/nothing/{SECRET}").status_code == 404


def test_a_scrape_after_traffic_has_every_series_and_no_conversation_id(url: str) -> None:
    _traffic(url)
    r = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer tok"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = _samples(r.text)
    outcomes = {labels["outcome"]: value for name, labels, value in samples if name == "histlog_appends_total"}
    assert outcomes == {"ok": 2, "conflict": 1, "closed": 1}
    decided = {labels["outcome"]: value for name, labels, value in samples
               if name == "histlog_admission_decisions_total"}
    assert decided["accepted"] == 1 and set(decided) == {"accepted", "duplicate", "conflict", "closed",
                                                         "precondition_failed", "not_replaceable", "cleared",
                                                         "erased", "fenced"}
    names = {name for name, _, _ in samples}
    for wanted in ("histlog_http_request_duration_seconds_bucket", "histlog_http_requests_total",
                   "histlog_http_requests_in_flight", "histlog_projector_lag_records", "histlog_projector_lag_seconds",
                   "histlog_applied_records", "histlog_log_end_offset", "histlog_poison_records_total",
                   "histlog_event_streams", "histlog_event_streams_dropped_total"):
        assert wanted in names, wanted
    routes = {labels["route"] for name, labels, _ in samples if name == "histlog_http_requests_total"}
    assert APPEND_ROUTE in routes and "/v1/conversations/{c}/messages" in routes and "unmatched" in routes
    statuses = {(labels["route"], labels["status"]) for name, labels, value in samples
                if name == "histlog_http_requests_total"}
    assert {(APPEND_ROUTE, "200"), (APPEND_ROUTE, "409"), (APPEND_ROUTE, "410")} <= statuses
    assert all(SECRET not in value for _, labels, _ in samples for value in labels.values())
    assert SECRET not in r.text
    lag = {labels["partition"]: value for name, labels, value in samples if name == "histlog_projector_lag_records"}
    assert lag == {"0": 0.0}


def test_metrics_need_the_token_when_one_is_set(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 401 and response.getheader("content-type") == "application/problem+json"
        response.read()
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer tok"})
        response = conn.getresponse()
        assert response.status == 200 and b"histlog_admission_decisions_total" in response.read()
    finally:
        conn.close()


def test_every_app_has_its_own_registry(engine: HistoryEngine) -> None:
    first, second = observability(engine), observability(engine)  # the default registry would refuse the second
    assert first.metrics.registry is not second.metrics.registry
    assert b"histlog_http_requests_in_flight" in second.metrics.scrape()


def test_lag_seconds_is_the_age_of_the_oldest_end_offset_not_applied(engine: HistoryEngine) -> None:
    collector = EngineCollector(engine)
    assert collector._lag_seconds(0, 10, 5, now=100.0) == 0.0  # first seen now
    assert collector._lag_seconds(0, 12, 5, now=103.0) == 3.0  # offset 10 seen 3 s ago, not applied yet
    assert collector._lag_seconds(0, 12, 10, now=104.0) == 1.0  # 10 applied; 12 was first seen at 103
    assert collector._lag_seconds(0, 12, 12, now=105.0) == 0.0  # caught up


def test_an_open_event_stream_counts_in_flight_and_as_a_stream(url: str) -> None:
    auth = {"Authorization": "Bearer tok"}
    with httpx.Client(base_url=url, headers=auth, timeout=10) as c, \
            c.stream("GET", f"/v1/conversations/{SECRET}/events") as events:
        assert events.status_code == 200
        samples = _samples(c.get("/metrics").text)
    values = {name: value for name, labels, value in samples if not labels}
    assert values["histlog_event_streams"] == 1
    assert values["histlog_http_requests_in_flight"] == 2  # the stream and this scrape
