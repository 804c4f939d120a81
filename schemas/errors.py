"""Every public error of histlog.

The tree (``ValueError`` / ``LookupError`` are mixed in where noted)::

    HistoryError
    ├── InvalidConversationID   (ValueError)  bad conversation id; fix the id
    ├── InvalidAppendID         (ValueError)  bad append id; fix the id
    ├── InvalidMessage          (ValueError)  a message breaks a rule; says what and where
    ├── InvalidBatch            (ValueError)  a batch breaks a rule (empty, bad message, ...)
    ├── InvalidReceipt          (ValueError)  a receipt does not name the batch it is checked against
    ├── InvalidWindow           (ValueError)  window limit <= 0
    ├── InvalidRequest          (ValueError)  an HTTP request is malformed (JSON, a parameter); names the field
    ├── InvalidConfiguration    (ValueError)  a bad open()/CLI setting (address, path, timeout...)
    │   ├── TopicRefused                      the Kafka topic cannot be used as asked (retention, partitions...)
    │   └── InvalidComponent    (TypeError)   a reader or writer without the method it must have
    ├── InvalidProjection       (ValueError)  register() got no Projection, or a bad or reserved name
    │   └── DuplicateProjection               another projection already has that name
    ├── ProjectionError                       a custom projection's apply() failed; it stopped
    ├── EngineClosed                          the HistoryEngine was closed; open a new one
    ├── AppendConflict                        the append id already names other content
    ├── ConversationClosed                    the conversation was cleared; use a new id
    ├── NotFound                (LookupError) an unknown or hidden message / turn
    ├── TurnNotReplaceable                    only the latest visible turn may be replaced
    ├── PreconditionFailed                    expected_last did not match
    ├── Fenced                                a later begin_run owns the conversation's writes now
    ├── WindowTooSmall                        the newest turn does not fit the window
    ├── CommitError                           generation succeeded, persistence did not (schemas.commit)
    ├── CommitUnconfirmed                     no decision in time; resend the same Batch
    ├── LogUnavailable                        the log backend is down or fail-stopped
    ├── StateUnavailable                      the RocksDB state is in use, failed or cannot be written
    │   └── KeyStoreDamaged                   a key store record is damaged: restore path/keys/ from a backup
    ├── CorruptLog                            a log record or segment is damaged
    │   └── DecryptionFailed                  a sealed record does not open under its key (tampered, moved): poison
    ├── KeyErased                             the data key was destroyed: the content is erased on purpose
    ├── SubscriptionLost                      a subscriber fell behind; subscribe again and re-read
    ├── Unauthorized                          the service wants a valid bearer token
    ├── NotOwner                              (cluster) this member does not own the conversation's partition
    └── NotReady                              (cluster) the owner has not caught up yet; retry

Every message says what went wrong and what to do next. Errors carry no I/O
handles and are safe to pickle or print.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AppendConflict",
    "CommitUnconfirmed",
    "ConversationClosed",
    "CorruptLog",
    "DecryptionFailed",
    "DuplicateProjection",
    "EngineClosed",
    "Fenced",
    "HistoryError",
    "InvalidAppendID",
    "InvalidBatch",
    "InvalidComponent",
    "InvalidConfiguration",
    "InvalidConversationID",
    "InvalidMessage",
    "InvalidProjection",
    "InvalidReceipt",
    "InvalidRequest",
    "InvalidWindow",
    "KeyErased",
    "KeyStoreDamaged",
    "LogUnavailable",
    "NotFound",
    "NotOwner",
    "NotReady",
    "PreconditionFailed",
    "ProjectionError",
    "SlotUnavailable",
    "StateUnavailable",
    "SubscriptionLost",
    "TopicRefused",
    "TurnNotReplaceable",
    "Unauthorized",
    "WindowTooSmall",
]


class HistoryError(Exception):
    """Root of every error histlog raises on purpose."""


class InvalidConversationID(HistoryError, ValueError):
    """A conversation id breaks a rule (empty, whitespace at an end, control character, too long...)."""


class InvalidAppendID(HistoryError, ValueError):
    """An append id breaks a rule (the same rules as conversation ids)."""


class InvalidMessage(HistoryError, ValueError):
    """A message, part or metadata value is invalid; the message says what and where."""


class InvalidBatch(HistoryError, ValueError):
    """A batch is invalid: no messages, an invalid message, or bytes that are not canonical."""


class InvalidReceipt(HistoryError, ValueError):
    """A receipt does not name the batch it was checked against."""


class InvalidWindow(HistoryError, ValueError):
    """A window limit is not positive."""


class InvalidRequest(HistoryError, ValueError):
    """An HTTP request to the service is malformed: a body that is not JSON or has unknown or
    missing members, a query parameter that is missing or cannot be parsed. The message names
    the field and the form it expects; nothing was read or written."""


class InvalidConfiguration(HistoryError, ValueError):
    """A setting given to ``open`` or the CLI is invalid (a malformed Kafka address, a data
    directory that is a file, a negative or NaN timeout...); nothing was opened or written."""


class TopicRefused(InvalidConfiguration):
    """The Kafka topic cannot be used as asked: it is missing and ``create=False``, it has another
    partition count than requested, its retention or cleanup policy would lose or compact history,
    or the cluster cannot give the replication factor. The message names the setting and the
    command that fixes it; nothing was written."""


class InvalidProjection(HistoryError, ValueError):
    """``register`` was given something that is not a ``projections.Projection``, or a projection
    whose ``name`` is empty, too long, has control characters or is reserved; nothing was run."""


class DuplicateProjection(InvalidProjection):
    """Another projection object is already registered under the same ``name``: names key the
    projection's state and checkpoints, so they must be unique; choose another name."""


class ProjectionError(HistoryError):
    """A custom projection's ``apply`` raised (``__cause__`` is its error): the projection stopped
    at that event, the history and the other projections go on. Fix it and ``register`` it again
    (it resumes from its checkpoint)."""


class EngineClosed(HistoryError):
    """The ``HistoryEngine`` was closed; every later call but ``close`` raises this. Open a new
    engine (``HistoryEngine.open``)."""


class AppendConflict(HistoryError):
    """The (conversation, append id) already names different content.

    A retry must resend the *same* Batch; new content needs a new append id.
    """

    def __init__(self, message: str, *, conversation_id: str = "", append_id: str = "",
                 existing_digest: str = "", digest: str = "") -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.append_id = append_id
        self.existing_digest = existing_digest
        self.digest = digest

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class ConversationClosed(HistoryError):
    """The conversation was cleared and is closed forever; start a new conversation id."""

    def __init__(self, message: str, *, conversation_id: str = "") -> None:
        super().__init__(message)
        self.conversation_id = conversation_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class NotFound(HistoryError, LookupError):
    """An unknown (or hidden) message or turn."""


class TurnNotReplaceable(HistoryError):
    """Only the latest visible turn can be replaced."""


class PreconditionFailed(HistoryError):
    """``expected_last`` did not name the conversation's last accepted append."""


class Fenced(HistoryError):
    """The write carried a fence (``begin_run``'s ``Fence``) older than the conversation's
    latest: another run began after it, and a run that lost the conversation never writes over
    its successor. ``latest`` is the conversation's latest epoch where the write was decided
    (0 when unknown). Stop this run; the successor owns the conversation's writes."""

    def __init__(self, message: str, *, conversation_id: str = "", latest: int = 0) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.latest = latest

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class SlotUnavailable(HistoryError):
    """The append was filed under a turn slot (``allocate_turn``'s ``TurnSlot``) that cannot take
    it: the slot was already used, it is another conversation's, no such slot was allocated, or a
    later turn was filed first (positions order the history, so a slot is usable only while no turn
    after it exists). A slot is spent whether or not it is used: allocate a new one."""

    def __init__(self, message: str, *, conversation_id: str = "", turn_id: str = "") -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.turn_id = turn_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class WindowTooSmall(HistoryError):
    """The newest complete turn (plus the merged system message) does not fit the window limit."""


class CommitUnconfirmed(HistoryError):
    """No admission decision arrived in time. The outcome is unknown: resend the same Batch."""


class LogUnavailable(HistoryError):
    """The log backend cannot take or serve records now (broker down, fail-stopped file log...).
    ``retryable`` is False when a retry against the same open engine cannot succeed (a
    fail-stopped file log: only a reopen recovers it)."""

    retryable: bool = True


class Unauthorized(HistoryError):
    """The service asks for ``Authorization: Bearer <token>`` and the request had none or
    another; pass the server's token (``HistoryClient(url, token=...)``, ``HISTLOG_TOKEN``)."""


class NotOwner(HistoryError):
    """(Cluster) the member that got a forwarded request does not own the conversation's
    partition (ownership moved): ask ``/v1/cluster`` for the owner and send it there."""


class NotReady(HistoryError):
    """(Cluster) the member owns the partition but has not caught up on it yet, or could not
    reach the owner: retry after ``Retry-After`` seconds (clients retry within their timeout)."""


class StateUnavailable(HistoryError):
    """This instance's RocksDB state cannot be used now: another process holds it, the disk is
    full, or the store failed while applying the log (the projector then stops). The log is
    unaffected; fix the cause and reopen (a damaged state is rebuilt from the log)."""


class CorruptLog(HistoryError):
    """A log record or segment is damaged or undecodable. ``reason`` says why, ``position`` where."""

    def __init__(self, message: str, *, reason: str = "", position: Any = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.position = position

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class DecryptionFailed(CorruptLog):
    """A sealed event does not open under the data key its key id names: a byte of its nonce,
    ciphertext or MAC was changed, it was moved to another record (the associated data binds it to
    its conversation, append id, key id and schema version), or the key is not the one it was
    sealed with. The record is poison (``reason`` says which check failed), never "erased"."""


class KeyErased(HistoryError):
    """The data key a sealed event names was destroyed (``clear``), so its content is gone on
    purpose: show the record as erased, never as poison. ``conversation_id`` and ``key_id`` say
    which key."""

    def __init__(self, message: str, *, conversation_id: str = "", key_id: str = "") -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.key_id = key_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class KeyStoreDamaged(StateUnavailable):
    """A record of the key store (``path/keys/`` or the Kafka keys topic) is damaged or was
    written under another master key. Keys cannot be rebuilt from the log: restore the key store
    from a backup (or open with the right ``master_key_file``). ``where`` names the file or
    offset."""

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(message)
        self.where = where

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class InvalidComponent(InvalidConfiguration, TypeError):
    """An object given to a constructor lacks a method it must have: a reader without
    ``read(conversation_id)``, a writer without ``append(batch)``, a ``retry``/``edit`` writer
    without ``replace_turn``... The message names the method and what to pass (usually a
    ``HistoryEngine``); nothing was read or written. Also a ``TypeError``, as it always was."""


class SubscriptionLost(HistoryError):
    """A subscription to accepted events fell further behind than its buffer holds, so events
    were dropped (the projector never waits for a consumer). ``position`` is the first dropped
    event's. Subscribe again, then re-read what you follow before consuming the new one."""

    def __init__(self, message: str, *, position: Any = None) -> None:
        super().__init__(message)
        self.position = position

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[HistoryError], args: tuple[Any, ...], state: dict[str, Any]) -> HistoryError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err
