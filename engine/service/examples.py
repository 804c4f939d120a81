"""Request examples of ``/openapi.json`` (taken from SERVICE.md and docs/service.md): each is a
body the server accepts, as ``tests/service/test_openapi_examples.py`` proves by sending every
one to a real server, and ``engine.service.openapi`` checks against the route's body model when
the document is built (an example that does not validate stops the app from being built).

An example may rely on what the conversation holds before it: ``after`` names what the tests
do first (``turn-1``: the ``append`` example stored as append ``turn-1``; ``run-1``: ``POST
.../runs/run-1``, the conversation's first run, whose epoch is 1)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["APPEND", "ASSETS", "BY_IDS", "CLEAR_PREFIX", "DELETE", "Example", "text"]


class Example(NamedTuple):
    """One named request body: ``summary`` is what the console shows as its label."""

    name: str
    summary: str
    value: Any
    after: tuple[str, ...] = ()


def text(role: str, value: str) -> dict[str, Any]:
    """A message of one text part, in its wire form (SERVICE.md "Representations")."""
    return {"role": role, "parts": [{"kind": "text", "text": value}]}


_TURN = [text("system", "Be brief."), text("user", "Hi"), text("assistant", "Hello!")]

APPEND = (
    Example("append", "Append one turn (system, user, assistant): a retry returns the same receipt",
            {"messages": _TURN}),
    Example("expected_last", "Append only to an empty conversation (else 412 PreconditionFailed)",
            {"messages": [text("user", "Bye")], "expected_last": "empty"}),
    Example("replaces", "Replace the latest turn (regenerate its answer): the old one is hidden from every read",
            {"messages": [text("user", "Hi"), text("assistant", "Hey")],
             "replaces": {"turn_id": "turn-1/1", "reason": "retry"}}, ("turn-1",)),
    Example("fence", "Append as the run of epoch 1 (begin_run's): refused as 409 Fenced once a later run began",
            {"messages": [text("assistant", "late")], "fence": 1}, ("run-1",)),
)
ASSETS = (
    Example("assets", "Link an image to message turn-1/1 (the user's \"Hi\") by its content hash",
            {"assets": [{"content_hash": "sha256:" + "9f" * 32, "role": "image", "ordinal": 0,
                         "mime": "image/jpeg"}]}, ("turn-1",)),
)
DELETE = (Example("ids", "Delete two messages from every read", {"ids": ["turn-1/2", "turn-9/0"]}, ("turn-1",)),)
BY_IDS = (Example("ids", "Read two messages by their ids", {"ids": ["turn-1/2", "turn-1/0"]}, ("turn-1",)),)
CLEAR_PREFIX = (Example("prefix", "Clear every conversation of bot 7", {"prefix": "bot-7/"}),)
