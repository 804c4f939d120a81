"""Data keys for sealed event content, kept outside the event log (docs/design.md §10).

* ``KeyStore`` (``base``): the contract; ``FileKeyStore`` (``files``): ``path/keys/``;
  ``KafkaKeyStore`` (``kafka``): the compacted topic ``<topic>.keys`` (``kafka_topic`` creates and
  checks it).
* ``MasterKey`` (``master``): optional wrapping of data keys at rest, its file format and
  ``HISTLOG_MASTER_KEY_FILE``.

How the engine uses them (docs/erasure.md):

1. ``HistoryEngine.open`` builds the store beside the log (``FileKeyStore(path / "keys")`` or
   ``KafkaKeyStore(bootstrap, topic + ".keys")``) with ``master_key_from(master_key_file)``.
2. Writes (``engine.writes``): ``key = store.create(c)`` (``KeyErased``: the conversation is
   closed), then ``schemas.event_content.seal_event``.
3. The projector (``projections.erasure.open_content``) opens sealed content with
   ``store.get(c, key_id)``: ``KeyErased`` -> the record is erased, ``DecryptionFailed`` -> poison.
4. ``clear``: after the step that closes the conversation, ``projections.erasure.destroy_keys`` calls
   ``store.destroy(c)``, then the eraser compacts the conversation's rows out of the state.

Tools: ``FileKeyStore(path, read_only=True)`` (inspect a store a server holds) and
``rotate_master_key`` (``histlog keys rotate``).
"""

from engine.keys.base import KeyStore
from engine.keys.files import FileKeyStore, rotate_master_key
from engine.keys.kafka import KafkaKeyStore
from engine.keys.kafka_topic import keys_topic_of
from engine.keys.master import ENV_MASTER_KEY_FILE, MasterKey, load_master_key, master_key_from, write_master_key

__all__ = ["ENV_MASTER_KEY_FILE", "FileKeyStore", "KafkaKeyStore", "KeyStore", "MasterKey", "keys_topic_of",
           "load_master_key", "master_key_from", "rotate_master_key", "write_master_key"]
