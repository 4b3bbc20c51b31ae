"""What icechunk's session store holds under which keys, and what it says of keys it cannot hold."""

from __future__ import annotations

# Keys below `SNAPSHOT_PREFIX + ID` are those of snapshot ID (the history under `.zarrfs/versions`):
# one store, one engine and one cache serve every version, each cached under its own paths.
# The prefix starts with `.zarrfs`, which no node name may.
SNAPSHOT_PREFIX = ".zarrfs-snapshot-"
# Errors icechunk raises for a key it cannot hold at all (a view asking for `t`, not `t/zarr.json`):
# such a key is simply absent.
INVALID_KEY = "invalid zarr key"
# ... or for a key of a node that does not exist (a staged array none of whose chunks is stored yet).
NO_NODE = "node not found"
# ... and for a prefix that is no node (a staged array none of whose chunks was stored): empty.
BAD_PREFIX = "bad key prefix"
