"""Arrays created in an xarray dataset: dimension names and fill values as xarray writes them."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..model import ArrayMeta, NewArray, Node

V2_DIMENSIONS_ATTR = "_ARRAY_DIMENSIONS"


def dimensions_of(node: Node) -> tuple[str, ...] | None:
    """The dimension names xarray reads for an array (None: it carries none)."""
    if not isinstance(node, ArrayMeta):
        return None
    names = node.dimension_names if node.format == "v3" else node.attributes.get(V2_DIMENSIONS_ATTR)
    if (
        not isinstance(names, (list, tuple))
        or len(names) != len(node.shape)
        or not all(isinstance(n, str) for n in names)
    ):
        return None
    return tuple(names)


def dataset_dimensions(siblings: Iterable[Node]) -> dict[str, set[int]] | None:
    """Dimension name -> lengths of a group's arrays; None when no array carries names
    (the group is no xarray dataset)."""
    found: dict[str, set[int]] | None = None
    for node in siblings:
        names = dimensions_of(node)
        if names is None or not isinstance(node, ArrayMeta):
            continue
        found = found if found is not None else {}
        for name, length in zip(names, node.shape):
            found.setdefault(name, set()).add(length)
    return found


def dimension_names(shape: tuple[int, ...], dims: dict[str, set[int]]) -> tuple[str, ...]:
    """Names for a new array's axes: an existing dimension's name where exactly one dimension of
    the group has that length, else `dim_<axis>_<length>` (with `_<k>` added while that name is
    taken by a dimension of another length or by an earlier axis)."""
    out: list[str] = []
    for axis, length in enumerate(shape):
        matches = [name for name, lengths in dims.items() if lengths == {length}]
        others = [name for name, lengths in dims.items() if length in lengths and name not in matches]
        if len(matches) == 1 and not others and matches[0] not in out:
            out.append(matches[0])
            continue
        base = candidate = f"dim_{axis}_{length}"
        k = 0
        while candidate in out or (candidate in dims and dims[candidate] != {length}):
            k += 1
            candidate = f"{base}_{k}"
        out.append(candidate)
    return tuple(out)


def in_dataset(new: NewArray, siblings: Iterable[Node], fmt: str) -> NewArray:
    """`new` as xarray would write it into the group holding `siblings` (unchanged when that
    group is no xarray dataset): dimension names, and the fill value xarray writes for its
    data type (real floats NaN, everything else v2 `null` / v3 zeros), so that no stored value
    reads as missing."""
    dims = dataset_dimensions(siblings)
    if dims is None:
        return new
    names = dimension_names(new.shape, dims)
    attributes = dict(new.attributes)
    if new.dtype.kind == "f":
        fill = np.full((), np.nan, dtype=new.dtype)
        if fmt == "v3":  # xarray keeps the missing-value mark of a v3 array in this attribute
            attributes["_FillValue"] = base64.b64encode(np.asarray(np.nan, "<f8").tobytes()).decode()
        return dataclasses.replace(new, fill_value=fill, dimension_names=names, attributes=attributes)
    return dataclasses.replace(new, fill_value=None, fill_null=True, dimension_names=names, attributes=attributes)


# Attributes xarray keeps for itself (an array's dimensions in v2, its missing-value mark in
# v3): a `setfattr` that omits them must not turn a dataset into one xarray cannot open.
XARRAY_OWN_ATTRS = {"v2": (V2_DIMENSIONS_ATTR,), "v3": ("_FillValue",)}


def attributes_kept(node: Node, new: dict[str, Any]) -> dict[str, Any]:
    """The attributes to store when a user sets NEW on an array: xarray's own ones the array
    carries are kept where NEW omits them; a key set to null in NEW removes one."""
    own = XARRAY_OWN_ATTRS.get(node.format, ()) if isinstance(node, ArrayMeta) else ()
    kept = {k: node.attributes[k] for k in own if k in node.attributes and k not in new}
    merged = {**kept, **new}
    return {k: v for k, v in merged.items() if not (k in own and v is None)}
