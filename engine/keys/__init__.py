"""Data keys for sealed event content, kept outside the event log (docs/design.md §10).

* ``KeyStore`` (``base``): the contract; ``FileKeyStore`` (``files``): ``path/keys/``;
  ``KafkaKeyStore`` (``kafka``): the compacted topic ``<topic>.keys`` (``kafka_topic`` creates and
  checks it).
* ``MasterKey`` (``master``): optional wrapping of data keys at rest, its file format and
  ``HISTLOG_MASTER_KEY_FILE``.

Wiring plan (the next slice; nothing here is called by the engine yet):

1. ``HistoryEngine.open`` builds the store beside the log (``FileKeyStore(path / "keys")`` or
   ``KafkaKeyStore(bootstrap, topic + ".keys")``) with ``master_key_from(master_key_file)``.
2. Write path: ``key = store.create(c)`` (cached per conversation), then ``seal`` the batch's
   canonical JSON (``schemas.sealed``) into a ``BatchAppended`` v3 / ``TurnReplaced`` v2 event
   (``events.py`` makes the .v3/.v2 files current and keeps today's as historic writers).
3. Projector: ``open_sealed(store.get(c, key_id), ...)`` gives the canonical bytes, then
   ``event_batch`` as today. ``KeyErased`` -> the record is erased (counted, shown as erased by
   ``tail`` / ``log verify``, the conversation treated as closed); ``DecryptionFailed`` -> poison.
4. Admission: a receipt stores ``(key_id, mac)`` instead of the digest; a retry with the same
   (c, a) is a duplicate iff ``store.get(c, receipt.key_id).mac(decrypted bytes) == receipt.mac``
   (so a racing instance's other key id still compares content, never key ids). Plain v1/v2
   receipts keep comparing digests.
5. ``clear``: append ``ConversationCleared`` -> ``store.destroy(c)`` -> delete the conversation's
   rows in every projection, ``compact_range`` over its prefix, flush and rotate the WAL -> return.
   A crash in between leaves it closed; the next ``clear`` or open finishes (destroy is idempotent).
"""

from engine.keys.base import KeyStore
from engine.keys.files import FileKeyStore
from engine.keys.kafka import KafkaKeyStore
from engine.keys.kafka_topic import keys_topic_of
from engine.keys.master import ENV_MASTER_KEY_FILE, MasterKey, load_master_key, master_key_from, write_master_key

__all__ = ["ENV_MASTER_KEY_FILE", "FileKeyStore", "KafkaKeyStore", "KeyStore", "MasterKey", "keys_topic_of",
           "load_master_key", "master_key_from", "write_master_key"]
