"""UUIDv7 (RFC 9562 §5.7): time-ordered ids for append ids the middleware makes itself.

Python 3.11's ``uuid`` has no ``uuid7`` (it arrives in 3.14), and the layout is small enough
to own rather than add a dependency for it::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                           unix_ts_ms                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          unix_ts_ms           |  ver  |       rand_a          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |var|                        rand_b                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                            rand_b                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Promises: version 7, variant ``10``; 48-bit Unix milliseconds; the 74 ``rand_a``/``rand_b``
bits are random from ``os.urandom`` (drawn in blocks: ``schemas.entropy``) for the first id of
a millisecond. Within one process ids are strictly increasing (RFC 9562 §6.2, method 2,
"monotonic random"): a later id in the same millisecond, or after the clock stepped back,
reuses the last timestamp and adds a random increment (1 to 2**32) to the previous 74 bits; if
those overflow, the timestamp moves on by one millisecond. Across processes uniqueness rests on
the 74 random bits.
"""

from __future__ import annotations

import threading
import time
import uuid

from schemas.entropy import random_bytes

__all__ = ["uuid7"]

_RAND_BITS = 74
_RAND_MAX = (1 << _RAND_BITS) - 1
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def uuid7() -> uuid.UUID:
    """A new UUIDv7, strictly greater than every earlier one this process made."""
    global _last_ms, _last_rand
    now_ms = time.time_ns() // 1_000_000
    with _lock:
        if now_ms > _last_ms:
            ms, rand = now_ms, int.from_bytes(random_bytes(10), "big") & _RAND_MAX
        else:  # same millisecond, or the clock stepped back: stay monotonic
            ms = _last_ms
            rand = _last_rand + 1 + int.from_bytes(random_bytes(4), "big")
            if rand > _RAND_MAX:
                ms, rand = ms + 1, int.from_bytes(random_bytes(10), "big") & (_RAND_MAX >> 1)
        _last_ms, _last_rand = ms, rand
    rand_a = rand >> 62  # the top 12 of the 74 random bits
    rand_b = rand & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)
