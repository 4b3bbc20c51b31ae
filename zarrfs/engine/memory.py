"""Fresh buffers in mappings of their own: decode targets, scratch buffers and band buffers."""

from __future__ import annotations

import contextlib
import mmap

import numpy as np

# Buffers of at least this size are asked to be backed by huge pages (private_buffer).
HUGE_PAGE_BYTES = 2 << 20


def private_buffer(nbytes: int) -> np.ndarray:
    """NBYTES of fresh memory (uint8) in a mapping of its own, private as malloc's are (the
    default, shared mapping faults through tmpfs, which is slower). OSError when out of memory.

    A buffer of HUGE_PAGE_BYTES or more starts at a huge page boundary of a mapping one huge page
    longer, advised to use huge pages (MADV_HUGEPAGE; the kernel's `enabled` setting still
    decides): first touched, it takes a fault per 2 MiB instead of per 4 KiB, and decoding into
    it and copying out of it miss the TLB less. These buffers are reused (spares), so few are
    ever faulted in and compaction for huge pages is rare."""
    if nbytes < HUGE_PAGE_BYTES:
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # (no MADV_HUGEPAGE: not Linux, or THP built out)
        region.madvise(mmap.MADV_HUGEPAGE)
    start = np.frombuffer(region, np.uint8, count=0).ctypes.data
    return np.frombuffer(region, np.uint8, count=nbytes, offset=-start % HUGE_PAGE_BYTES)
