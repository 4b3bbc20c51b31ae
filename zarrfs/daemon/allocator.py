"""The daemon's C allocator (glibc's malloc): one heap for every thread and, for stores whose
chunks come in buffers of their own, freed buffers kept for the next ones.

Icechunk reads each chunk into buffers it allocates with malloc, two per chunk (the read, and
the value it hands over). By default glibc gives each buffer over 128 KiB a mapping of its own,
which the kernel fills with zeroed pages one fault at a time on first touch and takes back on
free, and gives threads heaps (arenas) of their own: a cold read of a repository's array paid a
page fault per 4 KiB read (docs/PERFORMANCE.md: Icechunk). So:

- `one_heap`, before the daemon starts a thread: one arena serves every thread, so that memory
  one thread frees (the reader's, engine/fastpath/spares.py dropping chunks behind it) serves
  another's next allocation (icechunk's loading threads); plain stores read as fast either way;
- `keep_freed_buffers`, when the engine drops chunks behind readers, and on writable mounts:
  buffers of up to MMAP_MAX_BYTES come from that heap, which keeps up to KEEP_BYTES of freed
  memory instead of giving it back, so that a reader's loads cycle through memory that is
  there already, and a copy's write requests and new chunks through the memory of the chunks
  it stored before them.

Elsewhere than glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_MAX_BYTES = 64 << 20  # more than any chunk that a read-ahead window holds several of
KEEP_BYTES = 256 << 20


def _mallopt(settings: tuple[tuple[int, int], ...]) -> bool:
    """Apply mallopt SETTINGS; False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own: AttributeError elsewhere)
    except (OSError, AttributeError):
        return False
    for param, value in settings:
        if not libc.mallopt(param, value):
            log.debug("mallopt(%d, %d) refused", param, value)
    return True


def one_heap() -> bool:
    """One arena for every thread started from now on."""
    return _mallopt(((M_ARENA_MAX, 1),))


def keep_freed_buffers() -> bool:
    """Buffers of up to MMAP_MAX_BYTES from the heap, and up to KEEP_BYTES of freed ones kept."""
    return _mallopt(((M_MMAP_THRESHOLD, MMAP_MAX_BYTES), (M_TRIM_THRESHOLD, KEEP_BYTES)))
