"""``/openapi.json`` is a valid OpenAPI 3.1 document of every route, generated from the code."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate

from engine.facade import HistoryEngine
from engine.service.health import observability
from engine.service.openapi import document
from engine.service.routes import OPS
from tests.service.conftest import Served
from tests.service.server_support import call


@pytest.fixture
def served_document(served: Served) -> dict[str, Any]:
    status, head, doc = call(served.url, "GET", "/openapi.json")
    assert (status, head["content-type"]) == (200, "application/json")
    assert isinstance(doc, dict)
    return doc


def test_the_document_is_valid_openapi_3_1(served_document: dict[str, Any]) -> None:
    assert served_document["openapi"] == "3.1.0"
    validate(served_document)


def test_every_route_of_the_table_is_documented_with_its_errors(served_document: dict[str, Any]) -> None:
    for op in OPS:
        operation = served_document["paths"][op.path][op.method.lower()]
        assert str(op.ok[0]) in operation["responses"]
        for status in op.errors:
            problem = operation["responses"][str(status)]["content"]["application/problem+json"]
            assert problem["schema"] == {"$ref": "#/components/schemas/Problem"}
        assert [p["name"] for p in operation["parameters"] if p["in"] == "query"] == [p.name for p in op.query]


def test_request_and_response_schemas_are_the_wire_models(served_document: dict[str, Any]) -> None:
    schemas = served_document["components"]["schemas"]
    append = served_document["paths"]["/v1/conversations/{c}/appends/{a}"]["put"]
    assert append["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AppendBody"}
    assert schemas["AppendBody"]["additionalProperties"] is False
    assert schemas["Message"]["additionalProperties"] is False
    assert set(schemas["ReceiptModel"]["required"]) == {"conversation_id", "append_id", "digest", "position"}


def test_the_paths_are_exactly_the_service_routes(served_document: dict[str, Any]) -> None:
    assert {(path, method) for path, item in served_document["paths"].items() for method in item} == {
        (op.path, op.method.lower()) for op in OPS}


def test_the_document_with_the_event_stream_route_is_valid_too(engine: HistoryEngine) -> None:
    extras = observability(engine)
    try:
        doc = document((*OPS, *extras.ops))
    finally:
        extras.close()
    validate(doc)
    assert "/v1/conversations/{c}/events" in doc["paths"]
