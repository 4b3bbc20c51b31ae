"""An Icechunk repository as a zarrfs store: a session of one snapshot behind the Store interface.

store.py is the Store side (reads and listings of a session, run on an asyncio loop of its own),
writes.py its writes; chunkfiles.py where a local repository's chunks lie (icechunk 2.x);
repository.py the repository's side (opening it at a ref or snapshot, following a branch's tip,
the history, commits and conflicts), commitlock.py its commit lock; keys.py the keys.
`icechunk` is an optional extra (`zarrfs[icechunk]`), imported lazily.
"""

from .keys import SNAPSHOT_PREFIX
from .repository import looks_like_repository_sync
from .store import IcechunkStore

__all__ = ["SNAPSHOT_PREFIX", "IcechunkStore", "looks_like_repository_sync"]
