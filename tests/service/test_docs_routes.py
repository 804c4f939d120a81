"""docs/service.md has a section for every route of the table (``routes.OPS``, the runs' routes
among them), so a route added to the code is documented where users read the HTTP API."""

from __future__ import annotations

import re
from pathlib import Path

from engine.service.routes import OPS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "service.md"
_PLACEHOLDER = re.compile(r"\{[^}]*\}")


def _shape(method: str, path: str) -> str:
    """``METHOD path`` with every ``{name}`` as ``{}`` and no query: the docs name the path
    parameters in full (``{message_id}``), the table briefly (``{m}``)."""
    return f"{method} {_PLACEHOLDER.sub('{}', path.split('?', 1)[0])}"


def test_every_route_of_the_table_has_a_section_in_docs_service_md() -> None:
    headings = {_shape(*m.groups()) for line in DOCS.read_text(encoding="utf-8").splitlines()
                if (m := re.match(r"### `([A-Z]+) ([^`]+)`", line))}
    missing = [f"{op.method} {op.path}" for op in OPS if _shape(op.method, op.path) not in headings]
    assert not missing, f"docs/service.md lacks a '### `METHOD path`' section for: {missing}"
    assert {"POST /v1/conversations/{}/runs/{}", "GET /v1/conversations/{}/runs/{}"} <= headings
