"""Reading a sandboxed program's output with bounded memory.

:class:`Capture` keeps the first ``limit // 2`` and the last ``limit - limit // 2`` bytes of a
stream and discards the middle as it arrives: the trainer holds at most ``limit`` bytes per
stream, however much a program prints. :func:`read_until` reads stdout and stderr together
(``selectors``, non-blocking ``os.read`` in 64 KiB chunks) until both close or a deadline passes.

Convention: the limit counts bytes of the program's output (UTF-8 for text), so the decoded text
has at most ``limit`` characters; a cut output reads ``head + marker + tail`` with the marker
``\\n[... N bytes cut ...]\\n`` naming how much was dropped.
"""

from __future__ import annotations

import os
import selectors
import time

CHUNK = 1 << 16


class Capture:
    """The head and tail of one stream, at most ``limit`` bytes in all (``limit`` >= 1)."""

    def __init__(self, limit: int):
        self.head_limit, self.tail_limit = limit // 2, limit - limit // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data[-self.tail_limit:]
            del self.tail[:max(0, len(self.tail) - self.tail_limit)]

    @property
    def cut(self) -> int:
        """Bytes dropped between the head and the tail."""
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        return head + tail if not self.cut else f"{head}\n[... {self.cut} bytes cut ...]\n{tail}"


def read_until(streams: dict, deadline: float) -> bool:
    """Read every ``{file: Capture}`` stream until all reach end of file (True) or ``deadline``
    (``time.monotonic()``) passes (False; the streams stay open)."""
    sel = selectors.DefaultSelector()
    for f in streams:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in sel.select(timeout=min(left, 1.0)):
                try:
                    data = os.read(key.fileobj.fileno(), CHUNK)
                except BlockingIOError:
                    continue
                if data:
                    streams[key.fileobj].add(data)
                else:
                    sel.unregister(key.fileobj)
        return True
    finally:
        sel.close()
