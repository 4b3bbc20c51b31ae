"""A local disk cache of what a remote store returned: encoded chunks, shard indexes and ranges, documents.

`DiskCache` (entries.py) is the directory: entries written by rename, checked on read (length
and CRC-32C), bounded in bytes with least recently used entries evicted first, shared safely by
any number of zarrfs processes (an `flock` serialises accounting and eviction).
`DiskCachedStore` (cached.py) puts it in front of a remote `Store`'s reads; every other call goes
straight to the store. Pure and thread-safe: the engine calls the `_sync` methods from worker
threads.
"""

from .cached import DiskCachedStore, is_chunk_key, store_identity
from .entries import BLOCK_BYTES, Corrupt, DiskCache, Entry, default_cache_dir

__all__ = [
    "BLOCK_BYTES",
    "Corrupt",
    "DiskCache",
    "DiskCachedStore",
    "Entry",
    "default_cache_dir",
    "is_chunk_key",
    "store_identity",
]
