"""Read a child's stdout line by line off the pipe, keeping every byte, with a deadline.

Why not ``readline()`` on a text-mode ``Popen`` pipe and then ``communicate()``: ``readline()``
reads ahead into the file object's buffer (8 KiB at a time), and ``communicate(timeout=...)``
reads the file descriptor underneath with ``os.read``, so the read-ahead bytes are never returned
and the rest starts in the middle of a line. A crash test that did so dropped receipts it had been
given and, when the read-ahead ended mid-line, failed on the tail of a line ("not JSON"). Here one
buffer and one reader see the whole stream, so what the child wrote is exactly what is returned.
"""

from __future__ import annotations

import os
import select
import time


class PipeLines:
    """Lines (``bytes`` ending with ``b"\\n"``) from the read end ``fd`` of a pipe.

    ``line(deadline)`` returns the next complete line, or ``None`` at end of file; it raises
    ``TimeoutError`` if ``time.monotonic()`` passes ``deadline`` first, so a hung child cannot
    hang the caller. After ``None``, ``tail`` holds the bytes after the last newline (empty unless
    the writer was cut in the middle of a line)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = bytearray()
        self._eof = False

    @property
    def tail(self) -> bytes:
        return bytes(self._buf)

    def line(self, deadline: float) -> bytes | None:
        while (end := self._buf.find(b"\n")) < 0:
            if self._eof:
                return None
            self._fill(deadline)
        out = bytes(self._buf[: end + 1])
        del self._buf[: end + 1]
        return out

    def rest(self, deadline: float) -> list[bytes]:
        """Every remaining complete line, up to end of file (the writer gone)."""
        out = []
        while (ln := self.line(deadline)) is not None:
            out.append(ln)
        return out

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self._fd], [], [], left)[0]:
            raise TimeoutError("the child wrote no complete line before the deadline: is it hung?")
        chunk = os.read(self._fd, 65536)
        if chunk:
            self._buf += chunk
        else:
            self._eof = True
