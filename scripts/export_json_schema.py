"""Write schemas/message.schema.json: the JSON Schema of one ``Message``, exported from pydantic.

Run ``python scripts/export_json_schema.py`` after changing the message model; a unit test
fails while the committed file differs from a fresh export.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from schemas.messages import Message

TARGET = Path(__file__).resolve().parent.parent / "schemas" / "message.schema.json"


def export() -> str:
    """The schema as the exact text that is committed (sorted keys, 2-space indent, final newline)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FrozenDict defaults are left out of the schema, as intended
        schema: dict[str, Any] = TypeAdapter(Message).json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://histlog.dev/schemas/message.schema.json"
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    TARGET.write_text(export(), encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
