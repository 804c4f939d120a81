"""Turn slots over a real socket, by raw HTTP (SERVICE.md, docs/service.md): ``POST
.../turn-slots`` reserves a turn, an append filed under it with ``"turn": {"turn_id",
"position"}`` opens that turn, a slot used again (or behind a later turn) is a 409
``SlotUnavailable`` problem, and every bad ``"turn"`` is a 400 problem naming the field, with
nothing written."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.facade import HistoryEngine
from engine.service.health import observability
from tests.service.conftest import Served
from tests.service.server_support import call, serving
from tests.service.test_http_errors import HI, problem

C = "/v1/conversations/c"
SLOTS = f"{C}/turn-slots"
ANSWER = {"role": "assistant", "parts": [{"kind": "text", "text": "yo"}]}


def _allocate(served: Served) -> dict[str, Any]:
    status, head, slot = call(served.url, "POST", SLOTS)
    assert (status, head.get("content-type")) == (200, "application/json"), slot
    return slot  # type: ignore[no-any-return]


def _turn(slot: dict[str, Any]) -> dict[str, Any]:
    return {"turn_id": slot["turn_id"], "position": slot["position"]}


def _turns(served: Served) -> list[tuple[str, int]]:
    """(turn id, position) of each visible turn, read back from the server."""
    rows = call(served.url, "GET", f"{C}/messages")[2]["messages"]
    out: list[tuple[str, int]] = []
    for first in dict.fromkeys(r["id"] for r in rows if r["message"]["role"] == "user"):
        turn = call(served.url, "GET", f"{C}/messages/{first.replace('/', '%2F')}/turn")[2]
        out.append((turn["id"], turn["position"]))
    return out


def test_a_slot_names_its_turn_and_an_append_files_under_it(served: Served) -> None:
    assert call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI, ANSWER]})[0] == 200
    slot = _allocate(served)
    assert set(slot) == {"conversation_id", "turn_id", "position"}
    assert slot["conversation_id"] == "c" and slot["turn_id"].endswith("/0") and slot["position"] == 2
    assert _turns(served) == [("a1/0", 1)]  # reserved: no row yet
    body = {"messages": [HI, ANSWER], "turn": _turn(slot)}
    status, _, receipt = call(served.url, "PUT", f"{C}/appends/b1", body)
    assert status == 200 and receipt["append_id"] == "b1"
    assert call(served.url, "PUT", f"{C}/appends/b1", body)[2] == receipt  # an identical resend: its receipt
    assert _turns(served) == [("a1/0", 1), (slot["turn_id"], 2)]
    latest = call(served.url, "GET", f"{C}/turns/latest")[2]["turn"]
    assert (latest["id"], latest["request_message_id"], latest["assistant_message_id"]) == (
        slot["turn_id"], "b1/0", "b1/1")
    assert [m["position"] for m in call(served.url, "GET", f"{C}/messages")[2]["messages"]][2:] == ["2:3", "2:4"]


def test_a_slot_used_again_or_behind_a_later_turn_is_a_409_slot_unavailable(served: Served) -> None:
    slot, later = _allocate(served), _allocate(served)
    assert (slot["position"], later["position"]) == (1, 2) and slot["turn_id"] != later["turn_id"]
    assert call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI], "turn": _turn(slot)})[0] == 200
    reuse = {"messages": [HI], "turn": _turn(slot)}
    detail = problem(call(served.url, "PUT", f"{C}/appends/a2", reuse), 409, "SlotUnavailable", "already used")
    assert slot["turn_id"] in detail
    assert call(served.url, "PUT", f"{C}/appends/a3", {"messages": [HI]})[0] == 200  # position 3, no slot
    problem(call(served.url, "PUT", f"{C}/appends/a4", {"messages": [HI], "turn": _turn(later)}),
            409, "SlotUnavailable", "behind the latest turn")
    forged = {"turn_id": "slot-never/0", "position": 9}
    problem(call(served.url, "PUT", f"{C}/appends/a5", {"messages": [HI], "turn": forged}),
            409, "SlotUnavailable", "no turn slot")
    moved = {"messages": [HI], "turn": {**_turn(_allocate(served)), "position": 99}}
    problem(call(served.url, "PUT", f"{C}/appends/a6", moved), 409, "SlotUnavailable", "position")
    assert _turns(served) == [(slot["turn_id"], 1), ("a3/0", 3)]


def test_metrics_count_a_refused_slot_as_slot_unavailable(engine: HistoryEngine) -> None:
    obs = observability(engine)
    with serving(engine, **obs.app_options()) as url:
        try:
            slot = call(url, "POST", SLOTS)[2]
            body = {"messages": [HI], "turn": {"turn_id": slot["turn_id"], "position": slot["position"]}}
            assert call(url, "PUT", f"{C}/appends/a1", body)[0] == 200
            assert call(url, "PUT", f"{C}/appends/a2", body)[0] == 409
            text = httpx.get(url + "/metrics", timeout=10).text
        finally:
            obs.close()
    outcomes = {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == "histlog_appends_total"}
    assert outcomes == {"ok": 1, "slot_unavailable": 1}


GOOD = {"turn_id": "slot-x/0", "position": 1}


@pytest.mark.parametrize(("turn", "words"), [
    ({"position": 1}, ("turn.turn_id",)),
    ({"turn_id": "slot-x/0"}, ("turn.position",)),
    ({}, ("turn.",)),
    ({**GOOD, "position": "1"}, ("turn.position",)),
    ({**GOOD, "position": 0}, ("turn.position",)),
    ({**GOOD, "position": -1}, ("turn.position",)),
    ({**GOOD, "position": True}, ("turn.position",)),
    ({**GOOD, "position": 1.0}, ("turn.position",)),
    ({**GOOD, "position": 1.5}, ("turn.position",)),
    ({**GOOD, "position": 2**63}, ("turn.position",)),
    ({**GOOD, "position": None}, ("turn.position",)),
    ({**GOOD, "turn_id": 7}, ("turn.turn_id",)),
    ({**GOOD, "turn_id": None}, ("turn.turn_id",)),
    ({**GOOD, "conversation_id": "c"}, ("turn.conversation_id",)),
    ({**GOOD, "extra": 1}, ("turn.extra",)),
    ({**GOOD, "turn_id": "slot-x/1"}, ("turn", "slot-x/1")),
    ({**GOOD, "turn_id": "slot-x"}, ("turn", "slot-x")),
    ({**GOOD, "turn_id": ""}, ("turn",)),
    ("slot-x/0", ("turn",)),
    (["slot-x/0", 1], ("turn",)),
    (1, ("turn",)),
])
def test_a_bad_turn_is_a_400_naming_the_field_and_writes_nothing(served: Served, turn: object,
                                                                   words: tuple[str, ...]) -> None:
    slot = _allocate(served)
    problem(call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI], "turn": turn}), 400, "InvalidRequest",
            *words)
    assert call(served.url, "GET", f"{C}/messages")[2] == {"messages": []}  # nothing written
    ok = {"messages": [HI], "turn": _turn(slot)}
    assert call(served.url, "PUT", f"{C}/appends/a1", ok)[0] == 200  # the slot is still usable


def test_a_turn_with_replaces_or_without_a_user_message_is_a_400(served: Served) -> None:
    slot = _allocate(served)
    replace = {"messages": [HI], "replaces": {"turn_id": "a/0", "reason": "edit"}, "turn": _turn(slot)}
    problem(call(served.url, "PUT", f"{C}/appends/e1", replace), 400, "InvalidRequest", "turn", "replaces")
    problem(call(served.url, "PUT", f"{C}/appends/e2", {"messages": [ANSWER], "turn": _turn(slot)}),
            400, "InvalidBatch", "opens a turn")
    assert call(served.url, "GET", f"{C}/messages")[2] == {"messages": []}
    assert call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI], "turn": None})[0] == 200  # null: no slot
    assert _turns(served) == [("a1/0", 2)]  # after the slot it did not use


def test_allocating_in_a_cleared_conversation_or_with_a_bad_id_is_refused(served: Served) -> None:
    slot = _allocate(served)
    assert call(served.url, "DELETE", C)[0] == 204
    problem(call(served.url, "POST", SLOTS), 410, "ConversationClosed")
    problem(call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI], "turn": _turn(slot)}),
            410, "ConversationClosed")
    problem(call(served.url, "POST", "/v1/conversations/bad%01id/turn-slots"), 400, "InvalidConversationID")
    assert call(served.url, "GET", SLOTS)[0] == 405


def test_openapi_documents_the_slot_route_and_the_turn_member(served: Served) -> None:
    doc = httpx.get(served.url + "/openapi.json", timeout=10).json()
    op = doc["paths"]["/v1/conversations/{c}/turn-slots"]["post"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TurnSlotOut"}
    assert {"400", "410", "503", "504"} <= set(op["responses"])
    schemas = doc["components"]["schemas"]
    assert set(schemas["TurnSlotOut"]["required"]) == {"conversation_id", "turn_id", "position"}
    assert set(schemas["TurnIn"]["required"]) == {"turn_id", "position"}
    assert schemas["TurnIn"]["additionalProperties"] is False
    assert schemas["TurnIn"]["properties"]["position"]["minimum"] == 1
    turn = schemas["AppendBody"]["properties"]["turn"]
    assert {"$ref": "#/components/schemas/TurnIn"} in turn["anyOf"]
    assert "409" in doc["paths"]["/v1/conversations/{c}/appends/{a}"]["put"]["responses"]
