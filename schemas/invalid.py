"""Pydantic's ``ValidationError`` as histlog's ``InvalidMessage``: what and where, on one line.

``invalid(exc, "message")`` gives ``invalid message: parts[1]: kind 'tool_call' is not allowed
for role 'user'``: locations written as paths (``parts[0].media.data``, ``metadata['k']``),
pydantic's wording replaced where it says nothing to a person (``unknown member``, ``missing
required member``), and the reasons of a nested value's own ``InvalidMessage`` flattened in.
"""

from __future__ import annotations

from typing import Final

from pydantic import ValidationError

from schemas.errors import InvalidMessage

__all__ = ["TAGS", "invalid"]


TAGS: Final[set[str]] = set()
"""Every ``Literal`` tag value of the models (``schemas.model`` adds them): the discriminators
pydantic puts into error locations, which the location shown to a person leaves out."""


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    prev_index = False
    for comp in loc:
        if isinstance(comp, int):
            out += f"[{comp}]"
            prev_index = True
            continue
        if prev_index and comp in TAGS:  # the discriminator tag pydantic adds after a union index
            prev_index = False
            continue
        prev_index = False
        if comp.startswith("function-"):
            continue
        out += f".{comp}" if out else comp
    return out


def _join(outer: str, inner: str) -> str:
    if not outer or not inner:
        return outer or inner
    return outer + inner if inner.startswith("[") else f"{outer}.{inner}"


def _reasons(exc: ValidationError) -> list[tuple[str, str]]:
    """``(where, reason)`` for each error, flattening the ``InvalidMessage`` that a nested
    value's own validation raised."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False, include_input=False):
        kind = err.get("type", "")
        msg = err.get("msg", "")
        where = _where(tuple(err.get("loc", ())))
        cause = (err.get("ctx") or {}).get("error")
        nested = getattr(cause, "reasons", None) if isinstance(cause, InvalidMessage) else None
        if nested:
            out.extend((_join(where, w), r) for w, r in nested)
            continue
        if kind == "extra_forbidden":
            msg = "unknown member"
        elif kind == "missing":
            msg = "missing required member"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if msg.startswith("["):  # a validator that reports a sub-location, e.g. metadata['k']
            close = msg.find("]: ")
            if close > 0:
                where, msg = where + msg[: close + 1], msg[close + 3 :]
        out.append((where, msg))
    return out


def invalid(exc: ValidationError, what: str = "message") -> InvalidMessage:
    """Turn a pydantic ``ValidationError`` into an ``InvalidMessage``: what and where, one line.

    The result carries ``reasons``: a list of ``(where, reason)`` pairs.
    """
    reasons = _reasons(exc)
    lines = [f"{w}: {r}" if w else r for w, r in reasons]
    text = f"invalid {what}: {lines[0]}" if lines else f"invalid {what}"
    if len(lines) > 1:
        more = "; ".join(lines[1:4]) + ("; ..." if len(lines) > 4 else "")
        text += f" (and {len(lines) - 1} more: {more})"
    err = InvalidMessage(text)
    err.reasons = reasons  # type: ignore[attr-defined]
    return err
