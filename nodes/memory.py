"""Giving memory back to the kernel after a peer made the node hold a lot of it.

Rules of this module:

1. Freed is not returned: glibc's allocator serves a large buffer from its heap once a
   buffer of that size has been freed (its mmap threshold grows), and a heap gives
   pages back only from its top, so the buffers of a flood (partial frames, answers a
   peer did not read) stay resident after they are freed, unless something asks.
2. :class:`MemoryReturn` asks (``malloc_trim(0)``, which releases every free page of
   every heap), once the bytes released by connections that held them for a peer reach
   ``RETURN_AFTER_BYTES``, a short while later (``DELAY_S``: one call for a whole
   flood of closes), and only then: an honest connection holds nothing at its end, so
   the measured path never pays for it.
3. A fixed, low mmap threshold would return such buffers too, but would put every
   large honest buffer (an artifact record, ~300 KiB) on fresh pages: the p50 of a
   300 KiB fetch on loopback went from 8.5-9.2 ms to 17.8-21.4 ms (two runs each on
   this loaded host). Not done.
4. Where there is no glibc (no ``malloc_trim``) nothing is done.
5. Before asking, the cyclic garbage collector runs: a connection closed for its peer's
   fault leaves its buffers reachable only through a cycle (the exception that closed
   it, its traceback, the frames holding the received frame), which the collector's
   oldest generation would reach much later; until then ``malloc_trim`` finds nothing
   to give back (a flood of 1 MiB junk frames kept 65 MiB resident without it).
"""

from __future__ import annotations

import ctypes
import gc
import logging
from collections.abc import Callable

import trio

log = logging.getLogger("nodes.memory")

RETURN_AFTER_BYTES = 1024 * 1024
DELAY_S = 0.2


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()


def return_free_memory() -> bool:
    """Give every free page of the allocator's heaps back (False: no way to here)."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


class MemoryReturn:
    """Counts bytes let go after a peer held them; returns memory after a flood (rule 2)."""

    def __init__(self) -> None:
        self.pending_bytes = 0
        self.returns = 0
        self._scheduled = False

    def released(self, nbytes: int, nursery: trio.Nursery | None) -> None:
        """A connection let go of ``nbytes`` it held for a peer."""
        if nbytes <= 0 or _MALLOC_TRIM is None:
            return
        self.pending_bytes += nbytes
        if self.pending_bytes >= RETURN_AFTER_BYTES and not self._scheduled \
                and nursery is not None:
            self._scheduled = True
            nursery.start_soon(self._return_soon)

    async def _return_soon(self) -> None:
        try:
            await trio.sleep(DELAY_S)
        finally:
            self._scheduled = False
        freed, self.pending_bytes = self.pending_bytes, 0
        gc.collect()
        return_free_memory()
        self.returns += 1
        log.debug("returned free memory to the kernel after %d bytes held for peers", freed)
