"""``/openapi.json``: the OpenAPI 3.1 document, generated from the route table and the wire models.

Nothing here is written by hand but the framing: each ``routes.Op`` gives a path item (its path
parameters, its ``routing.Param`` query parameters, its body model, its success model and its error
statuses), and every schema under ``components/schemas`` is pydantic's ``model_json_schema`` of
the very models that validate the bodies (``engine.service.wire``). A route the code changes is
a document that changes with it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from engine.service.problems import CONTENT_TYPE
from engine.service.routing import CHOICES, Param
from engine.service.wire import _POSITION, FORWARDED_HEADER, MAX_INT, Problem

if TYPE_CHECKING:
    from engine.service.routes import Op

__all__ = ["document"]

_REF = "#/components/schemas/{model}"
_ERRORS = {
    400: "invalid request (malformed JSON, unknown member, wrong type, invalid id, bad parameter)",
    401: "missing or wrong bearer token",
    404: "no such conversation, message or route",
    409: "append conflict (the append id names other content), turn not replaceable, fenced, or slot unavailable",
    410: "the conversation is closed",
    412: "expected_last does not match",
    413: "request body over the server's limit",
    421: "this member does not own the conversation's partition",
    422: "the window is too small for the latest turn",
    503: "log unavailable or not ready: retry after Retry-After",
    504: "commit unconfirmed: resend the same batch",
}


def _query_schema(param: Param) -> dict[str, Any]:
    if param.kind == "int":
        return {"type": "integer", "minimum": param.minimum, "maximum": MAX_INT}
    if param.kind in ("history", "log"):
        return {"type": "string", "pattern": _POSITION}
    if param.kind == "bool":
        return {"type": "boolean"}
    if param.kind in CHOICES:
        return {"type": "string", "enum": list(CHOICES[param.kind])}
    if param.kind == "time":
        return {"type": "string", "format": "date-time"}
    return {"type": "string"}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _operation(op: Op) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
         "description": "one percent-encoded path segment (`/` is %2F)"}
        for name in re.findall(r"\{(\w+)\}", op.path)]
    params += [{"name": p.name, "in": "query", "required": p.required, "schema": _query_schema(p),
                "description": p.description, **({} if p.example is None else {"example": _param_example(p)})}
               for p in op.query]
    if op.routed:
        params.append({"name": FORWARDED_HEADER, "in": "header", "required": False,
                       "schema": {"type": "string", "enum": ["1"]},
                       "description": "the request already took its one hop (forwarded, or routed by "
                                      "/v1/cluster): a member that does not own the partition answers 421"})
    status, model = op.ok
    ok: dict[str, Any] = {"description": "success"}
    if model is not None:
        ok["content"] = {op.ok_media: {"schema": _ref(model)}}
    elif op.ok_media != "application/json":
        ok["content"] = {op.ok_media: {"schema": {"type": "string"}}}
    responses: dict[str, Any] = {str(status): ok}
    for code in sorted({*op.errors, 400, 401, 404, 500, *((421, 503) if op.routed else ())}):
        responses[str(code)] = {"description": _ERRORS.get(code, "unexpected server failure"),
                                "content": {CONTENT_TYPE: {"schema": _ref(Problem)}}}
    out: dict[str, Any] = {"operationId": op.name, "summary": op.summary, "parameters": params,
                           "responses": responses}
    if op.body is not None:
        media: dict[str, Any] = {"schema": _ref(op.body)}
        if op.examples:
            media["examples"] = {e.name: {"summary": e.summary, "value": _checked(op, e.value)} for e in op.examples}
        out["requestBody"] = {"required": True, "content": {"application/json": media}}
    return out


def _param_example(param: Param) -> Any:
    """A query parameter's example as its schema's type (the query text of an int is a number)."""
    assert param.example is not None  # Invariant: only called for parameters with an example.
    if param.kind == "int":
        return int(param.example)
    if param.kind == "bool":
        return param.example == "true"
    return param.example


def _checked(op: Op, value: Any) -> Any:
    """``value`` once it validates against ``op``'s body model (the server's own): an example
    the server would refuse is a bug of the route table, found when the app is built."""
    assert op.body is not None  # Invariant: only called for operations with a body.
    try:
        op.body.model_validate(value)
    except ValidationError as exc:
        raise ValueError(f"the example of {op.method} {op.path} does not validate as {op.body.__name__}: "
                         f"{exc}") from None
    return value


def document(ops: Sequence[Op]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ops``."""
    models = {m for op in ops for m in (op.body, op.ok[1]) if m is not None} | {Problem}
    with warnings.catch_warnings():  # metadata's default (an empty FrozenDict) is not JSON: pydantic omits it
        warnings.simplefilter("ignore")
        _, schemas = models_json_schema([(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
                                        ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "histlog", "version": "1",
                 "description": "The histlog conversation-history service (SERVICE.md). Errors are "
                                "application/problem+json; title is the histlog error class."},
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {}),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
