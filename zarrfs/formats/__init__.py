"""Format detection: tell the families apart by their documents, or take `format=`."""

from __future__ import annotations

from ..errors import UserError
from ..options import Options
from ..storage.base import BaseStore
from .base import Hierarchy
from .v1 import V1Hierarchy
from .v2 import V2Hierarchy
from .v3 import V3Hierarchy
from .v3draft import V3DraftHierarchy

# Detection order: v3 before v2 (a store can hold both only by accident; v3 is newer).
FORMATS: dict[str, type[Hierarchy]] = {"v3": V3Hierarchy, "v2": V2Hierarchy, "v1": V1Hierarchy}
# The v3 drafts first: their zarr.json holds a URI string, never the final v3's `3`.
FORMATS = {"v3-draft": V3DraftHierarchy, **FORMATS}


def open_hierarchy_sync(store: BaseStore, fmt: str = "auto", options: Options | None = None) -> Hierarchy:
    """Open the hierarchy in `store`, detecting its format unless `fmt` names one."""
    options = options or Options()
    if fmt != "auto":
        if fmt not in FORMATS:
            raise UserError(f"format {fmt} is not supported yet")
        cls = FORMATS[fmt]
        hierarchy = cls.open_sync(store, options)
        if not cls.detect_sync(store) and not hierarchy.children_sync(""):
            raise UserError(f"{store.source}: {V1Hierarchy.malformed_sync(store) or f'not a {fmt} hierarchy'}")
        return hierarchy
    for cls in FORMATS.values():
        if cls.detect_sync(store):
            return cls.open_sync(store, options)
    # No document at the root: a hierarchy of implicit groups (tensorstore writes no groups).
    for cls in FORMATS.values():
        hierarchy = cls.open_sync(store, options)
        if hierarchy.node_sync("") is not None and hierarchy.children_sync(""):
            return hierarchy
    problem = V1Hierarchy.malformed_sync(store)
    if problem:
        raise UserError(f"{store.source}: {problem}")
    raise UserError(f"{store.source}: not a Zarr hierarchy (no .zarray, .zgroup, .zmetadata, zarr.json or meta)")
