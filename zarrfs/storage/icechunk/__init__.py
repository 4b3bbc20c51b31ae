"""An Icechunk repository as a zarrfs store: a session of one snapshot behind the Store interface.

store.py is the Store side (reads, listings and writes of a session, run on an asyncio loop of
its own); repository.py the repository's (opening it at a ref or snapshot, following a branch's
tip, the history, commits and conflicts). `icechunk` is an optional extra (`zarrfs[icechunk]`),
imported lazily.
"""

from .repository import looks_like_repository_sync
from .store import SNAPSHOT_PREFIX, IcechunkStore

__all__ = ["SNAPSHOT_PREFIX", "IcechunkStore", "looks_like_repository_sync"]
