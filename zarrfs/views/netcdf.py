"""A group as a netCDF classic file (CDF-2, or CDF-5 where needed): the header bytes and where each variable's data lies.

The file is the header, then each variable's elements big-endian in C order, each padded
to 4 bytes (non-record variables only). `NetcdfFile.parts` maps a byte range to header
bytes, padding, and byte ranges of the variables' data (layouts.ArrayStream with a
big-endian dtype: converted while reading; 64-bit integers stored as int are narrowed by
`Variable.data_bytes`). Types and fill values follow xarray: unsigned integers as the
signed type of their width marked `_Unsigned`, 64-bit integers whose values fit as int
(the values are scanned by the caller, `scan_wanted`), `_FillValue` as xarray reads it
per format (`fill_value_of`). Pure: no I/O, no trio.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import grid
from ..errors import ZarrfsError
from ..model import ArrayMeta, Node
from .streams import ArrayStream

# Tags and type codes of the netCDF classic format specification.
NC_DIMENSION, NC_VARIABLE, NC_ATTRIBUTE = 0x0A, 0x0B, 0x0C
NC_BYTE, NC_CHAR, NC_SHORT, NC_INT, NC_FLOAT, NC_DOUBLE = 1, 2, 3, 4, 5, 6
NC_UBYTE, NC_USHORT, NC_UINT, NC_INT64, NC_UINT64 = 7, 8, 9, 10, 11
# Types of CDF-1/2; the others need CDF-5.
CLASSIC_TYPES = {NC_BYTE, NC_CHAR, NC_SHORT, NC_INT, NC_FLOAT, NC_DOUBLE}
NC_DTYPES = {
    NC_BYTE: ">i1",
    NC_CHAR: "S1",
    NC_SHORT: ">i2",
    NC_INT: ">i4",
    NC_FLOAT: ">f4",
    NC_DOUBLE: ">f8",
    NC_UBYTE: ">u1",
    NC_USHORT: ">u2",
    NC_UINT: ">u4",
    NC_INT64: ">i8",
    NC_UINT64: ">u8",
}
# numpy kind and size -> netCDF type (booleans as bytes 0/1, as netCDF writers store them)
TYPE_OF = {
    ("i", 1): NC_BYTE,
    ("b", 1): NC_BYTE,
    ("i", 2): NC_SHORT,
    ("i", 4): NC_INT,
    ("f", 4): NC_FLOAT,
    ("f", 8): NC_DOUBLE,
    ("u", 1): NC_UBYTE,
    ("u", 2): NC_USHORT,
    ("u", 4): NC_UINT,
    ("i", 8): NC_INT64,
    ("u", 8): NC_UINT64,
}
# netCDF3's coercions (xarray's, netCDF-Java's): unsigned integers as the signed type of the
# same width, marked `_Unsigned = "true"` (the same bytes, read back as unsigned).
SIGNED_OF = {NC_UBYTE: NC_BYTE, NC_USHORT: NC_SHORT, NC_UINT: NC_INT}
# 64-bit integers whose values all fit are stored as int, as netCDF3 writers do; deciding
# that reads the values, so only arrays whose decoded chunks take at most this many bytes, in
# at most this many chunks (one store read each), are scanned (coordinates such as time are
# small); larger ones stay 64-bit (CDF-5).
SCAN_MAX_BYTES = 4 * 2**20
SCAN_MAX_CHUNKS = 256
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# CDF-2 counts (dimension lengths, vsize) are 32-bit: larger ones need CDF-5.
CDF2_MAX_DIM = 2**31 - 1
CDF2_MAX_VSIZE = 2**32 - 4
# The xarray convention for dimension names of Zarr v2 arrays (consumed, not copied).
XARRAY_DIMS = "_ARRAY_DIMENSIONS"
# The global attribute listing what the file leaves out.
LEFT_OUT_ATTR = "zarrfs_left_out"
PAD = 4
# Each variable's data starts on a page: a page-cache read of one variable's slab (the kernel
# reads whole pages) then never loads another variable's chunks. Readers take `begin` from
# the header, so the gaps (zeros) are allowed, as netCDF-C's own v_align makes them.
VAR_ALIGN = 4096


def nc_type(dtype: np.dtype) -> int | None:
    """The netCDF type of a numpy dtype, None when netCDF has none (strings, complex, records, dates)."""
    if dtype.fields is not None:
        return None
    return TYPE_OF.get((dtype.kind, dtype.itemsize))


def _padded(n: int) -> int:
    return -(-n // PAD) * PAD


@dataclass
class Variable:
    name: str
    meta: ArrayMeta
    dims: list[str]
    type: int
    attrs: list[tuple[str, int, bytes, int]]  # (name, type, big-endian values, count)
    begin: int = 0
    stream: ArrayStream | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.meta.shape) * np.dtype(NC_DTYPES[self.type]).itemsize

    @property
    def narrowed(self) -> bool:
        """Whether 64-bit integers are stored as int (the stream reads them as they are)."""
        return self.meta.dtype.itemsize == 8 and self.type == NC_INT

    def source_range(self, offset: int, size: int) -> tuple[int, int]:
        """(offset, size) in `stream` of the bytes that data bytes [offset, offset+size) come from."""
        if not self.narrowed:
            return offset, size
        first, stop = offset // 4, -(-(offset + size) // 4)
        return first * 8, (stop - first) * 8

    def data_bytes(self, raw: bytes | memoryview, offset: int, size: int) -> bytes | memoryview:
        """Data bytes [offset, offset+size) from the stream's bytes that `source_range` named.

        A narrowed variable whose values no longer fit int (changed after the file was laid
        out) is an error rather than wrapped values."""
        if not self.narrowed:
            return raw
        values = np.frombuffer(raw, self.meta.dtype)
        if not fits_int32(values):
            raise ZarrfsError(
                f"{self.meta.path}: values written after its netCDF file was laid out "
                f"no longer fit the file's int variable {self.name}"
            )
        skip = offset % 4
        return values.astype(">i4").tobytes()[skip : skip + size]


def fits_int32(values: np.ndarray) -> bool:
    """Whether every integer in `values` fits netCDF's int."""
    return values.size == 0 or bool(values.min() >= INT32_MIN and values.max() <= INT32_MAX)


def scan_wanted(meta: ArrayMeta) -> bool:
    """Whether an array's values decide its netCDF type: 64-bit integers, small enough to scan."""
    chunks = grid.n_chunks(meta.shape, meta.chunk_shape)
    return (
        nc_type(meta.dtype) in (NC_INT64, NC_UINT64)
        and chunks <= SCAN_MAX_CHUNKS
        and chunks * meta.chunk_nbytes <= SCAN_MAX_BYTES
    )


def storage_type(meta: ArrayMeta, fits: bool) -> int:
    """The netCDF type an array is stored as; `fits`: its values all fit int (see `scan_wanted`)."""
    type_ = nc_type(meta.dtype)
    assert type_ is not None  # (asked only of arrays netCDF can hold)
    if type_ in SIGNED_OF:
        return SIGNED_OF[type_]
    if type_ in (NC_INT64, NC_UINT64) and fits:
        return NC_INT
    return type_


def _number_attr(values: list[Any], cdf5: bool) -> tuple[int, bytes, int] | None:
    """Numbers as one netCDF type (ints as INT, or INT64 in CDF-5, else DOUBLE when exact); None when not."""
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return None
    if all(isinstance(v, int) for v in values):
        if all(-(2**31) <= v < 2**31 for v in values):
            return NC_INT, np.asarray(values, ">i4").tobytes(), len(values)
        if cdf5 and all(-(2**63) <= v < 2**63 for v in values):
            return NC_INT64, np.asarray(values, ">i8").tobytes(), len(values)
        if not all(float(v) == v for v in values):
            return None
    return NC_DOUBLE, np.asarray(values, ">f8").tobytes(), len(values)


def attribute(name: str, value: Any, cdf5: bool) -> tuple[str, int, bytes, int]:
    """An attribute as netCDF holds it: text, numbers, or anything else as JSON text."""
    from .registry import jsonable

    if isinstance(value, str):
        data = value.encode()
        return name, NC_CHAR, data, len(data)
    numbers = _number_attr(value if isinstance(value, list) else [value], cdf5)
    if numbers is not None:
        return (name, *numbers)
    data = json.dumps(jsonable(value)).encode()
    return name, NC_CHAR, data, len(data)


def fill_value_of(meta: ArrayMeta) -> tuple[Any, str | None]:
    """The `_FillValue` xarray reads for an array (None when it has none), and why an attribute
    that should give one is not understood (else None).

    v2 (and v1, and the v3 drafts, which xarray read through zarr-python 2 in the same way):
    the array's `fill_value`, unless null. v3: only a `_FillValue` attribute (a v3
    `fill_value` is what unwritten chunks hold, not "missing"), as xarray writes it: a number,
    or for floats the base64 of a little-endian double (also accepted: zarr's "NaN",
    "Infinity", "-Infinity").
    """
    if meta.format != "v3" and meta.erase_fill_chunks:
        return meta.fill_value, None
    if "_FillValue" not in meta.attributes:
        return None, None
    value = meta.attributes["_FillValue"]
    try:
        return _fill_from_attribute(value, meta.dtype), None
    except (ValueError, TypeError, OverflowError, binascii.Error, struct.error):
        return None, f"{meta.path.rsplit('/', 1)[-1]}: _FillValue {json.dumps(value)[:40]} is no {meta.dtype} value"


def _fill_from_attribute(value: Any, dtype: np.dtype) -> np.ndarray:
    """A `_FillValue` attribute's value as a 0-d array of `dtype` (ValueError & co when it is not one)."""
    if dtype.kind == "f":
        if isinstance(value, str):
            named = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
            value = named[value] if value in named else struct.unpack("<d", base64.b64decode(value, validate=True))[0]
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(value)
        return np.asarray(value, dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise TypeError(value)
    if dtype.kind == "b":
        return np.asarray(bool(value), dtype)
    info = np.iinfo(dtype)
    if not info.min <= int(value) <= info.max:
        raise ValueError(value)
    return np.asarray(int(value), dtype)


def fill_attribute(fill: Any, type_: int) -> tuple[str, int, bytes, int]:
    """`_FillValue` in the variable's stored type (unsigned: the same bits, read as signed)."""
    return "_FillValue", type_, np.asarray(fill).astype(NC_DTYPES[type_]).tobytes(), 1


def dimension_names(meta: ArrayMeta) -> list[Any]:
    """Declared names of an array's dimensions: v3 `dimension_names`, else xarray's `_ARRAY_DIMENSIONS`."""
    names = meta.dimension_names
    if names is None:
        names = meta.attributes.get(XARRAY_DIMS)
    if not isinstance(names, (list, tuple)) or len(names) != len(meta.shape):
        return [None] * len(meta.shape)
    return [n if isinstance(n, str) and n and "/" not in n else None for n in names]


@dataclass
class NetcdfFile:
    """The netCDF file of one group: its header, variables and size."""

    attributes: dict[str, Any]
    arrays: list[ArrayMeta]
    child_groups: list[str] = field(default_factory=list)
    #: paths of the 64-bit integer arrays whose values all fit int (scanned by the caller)
    fit_int32: set[str] = field(default_factory=set)
    left_out: list[str] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    variables: list[Variable] = field(default_factory=list)

    def __post_init__(self) -> None:
        taken: set[str] = set()
        candidates = []
        for meta in self.arrays:
            name = meta.path.rsplit("/", 1)[-1]
            if nc_type(meta.dtype) is None:
                self.left_out.append(f"{name}: data type {meta.dtype} has no netCDF type")
            elif 0 in meta.shape:
                self.left_out.append(f"{name}: a dimension of length 0 would be netCDF's record dimension")
            else:
                fill, bad_fill = fill_value_of(meta)
                self.left_out += [bad_fill] if bad_fill else []
                fits = meta.path in self.fit_int32 and (fill is None or fits_int32(np.asarray(fill)))
                candidates.append((name, meta, storage_type(meta, fits), fill))
                taken.add(name)
        self.left_out += [f"{g}: a child group (its own file)" for g in self.child_groups]
        self.cdf5 = any(
            t not in CLASSIC_TYPES
            or max(m.shape, default=0) > CDF2_MAX_DIM
            or _padded(math.prod(m.shape) * np.dtype(NC_DTYPES[t]).itemsize) > CDF2_MAX_VSIZE
            for _, m, t, _ in candidates
        )
        for name, meta, type_, fill in candidates:
            dims = [
                self._dimension(n, length, name, i, taken)
                for i, (n, length) in enumerate(zip(dimension_names(meta), meta.shape))
            ]
            unsigned = nc_type(meta.dtype) in SIGNED_OF
            # (a signed array's own `_Unsigned` stays: xarray decodes it in Zarr stores as well)
            attrs = [
                attribute(k, v, self.cdf5)
                for k, v in meta.attributes.items()
                if k not in (XARRAY_DIMS, "_FillValue") and not (unsigned and k == "_Unsigned")
            ]
            attrs += [fill_attribute(fill, type_)] if fill is not None else []
            if unsigned:
                attrs.append(attribute("_Unsigned", "true", self.cdf5))
            self.variables.append(Variable(name, meta, dims, type_, attrs))
        self._layout()

    def _dimension(self, name: str | None, length: int, var: str, i: int, taken: set[str]) -> str:
        """A shared dimension of that name and length, or a generated one (unnamed or conflicting)."""
        if name is not None and self.dims.get(name, length) == length:
            self.dims[name] = length
            return name
        base = f"{var}_dim{i}" if name is None else f"{name}_{length}"
        new, k = base, 1
        while new in self.dims or new in taken:
            new, k = f"{base}_{k}", k + 1
        self.dims[new] = length
        return new

    # --- bytes ---------------------------------------------------------------------

    def _count(self, n: int) -> bytes:
        return struct.pack(">q" if self.cdf5 else ">i", n)

    def _name(self, name: str) -> bytes:
        data = name.encode()
        return self._count(len(data)) + data + b"\0" * (_padded(len(data)) - len(data))

    def _attrs(self, attrs: list[tuple[str, int, bytes, int]]) -> bytes:
        if not attrs:
            return struct.pack(">i", 0) + self._count(0)
        out = [struct.pack(">i", NC_ATTRIBUTE), self._count(len(attrs))]
        for name, type_, data, count in attrs:
            out += [
                self._name(name),
                struct.pack(">i", type_),
                self._count(count),
                data,
                b"\0" * (_padded(len(data)) - len(data)),
            ]
        return b"".join(out)

    def _header(self) -> bytes:
        dim_ids = {name: i for i, name in enumerate(self.dims)}
        out = [b"CDF" + bytes([5 if self.cdf5 else 2]), self._count(0)]  # no record variables
        if self.dims:
            out += [struct.pack(">i", NC_DIMENSION), self._count(len(self.dims))]
            out += [self._name(n) + self._count(length) for n, length in self.dims.items()]
        else:
            out += [struct.pack(">i", 0), self._count(0)]
        gattrs = [attribute(k, v, self.cdf5) for k, v in self.attributes.items()]
        if self.left_out:
            gattrs.append(attribute(LEFT_OUT_ATTR, "; ".join(self.left_out), self.cdf5))
        out.append(self._attrs(gattrs))
        if not self.variables:
            return b"".join(out + [struct.pack(">i", 0), self._count(0)])
        out += [struct.pack(">i", NC_VARIABLE), self._count(len(self.variables))]
        for v in self.variables:
            out += [self._name(v.name), self._count(len(v.dims))]
            out += [self._count(dim_ids[d]) for d in v.dims]
            out += [
                self._attrs(v.attrs),
                struct.pack(">i", v.type),
                self._count(_padded(v.nbytes)),
                struct.pack(">q", v.begin),
            ]
        return b"".join(out)

    def _layout(self) -> None:
        """Offsets of each variable's data (the header's length does not depend on them)."""
        offset = len(self._header())
        for v in self.variables:
            v.begin = offset = -(-offset // VAR_ALIGN) * VAR_ALIGN
            offset += _padded(v.nbytes)
            # (a narrowed variable's stream keeps its own dtype: data_bytes converts, checked)
            dtype = v.meta.dtype if v.narrowed else np.dtype(NC_DTYPES[v.type])
            v.stream = ArrayStream(v.meta, "C", with_header=False, dtype=dtype)
        self.header = self._header()
        self.size = offset

    def parts(self, offset: int, size: int) -> Iterator[bytes | tuple[int, ArrayStream, int, int]]:
        """What bytes [offset, offset+size) are made of, in order: literal bytes (header, padding),
        or (variable number, its stream, offset in the variable's data, size): the bytes come from
        the stream's `source_range` through `data_bytes` (the same range, unless narrowed)."""
        end = min(offset + size, self.size)
        if offset < len(self.header):
            yield self.header[offset:end]
        gap_from = len(self.header)
        for i, v in enumerate(self.variables):
            yield from self._zeros(offset, end, gap_from, v.begin)
            lo, hi = max(offset, v.begin), min(end, v.begin + v.nbytes)
            if lo < hi:
                assert v.stream is not None  # (every variable of a laid-out file has its stream)
                yield i, v.stream, lo - v.begin, hi - lo
            gap_from = v.begin + v.nbytes
        yield from self._zeros(offset, end, gap_from, self.size)

    @staticmethod
    def _zeros(offset: int, end: int, lo: int, hi: int) -> Iterator[bytes]:
        """The padding between `lo` and `hi` that [offset, end) covers."""
        lo, hi = max(offset, lo), min(end, hi)
        if lo < hi:
            yield b"\0" * (hi - lo)


def group_arrays(children: list[Node]) -> list[ArrayMeta]:
    """The arrays among a group's child nodes (the candidates for variables)."""
    return [n for n in children if isinstance(n, ArrayMeta)]


def group_file(group_attrs: dict[str, Any], children: list[Node], fit_int32: set[str] | None = None) -> NetcdfFile:
    """The netCDF file of a group from its attributes and child nodes; `fit_int32`: paths of the
    scanned 64-bit integer arrays whose values all fit int."""
    groups = [n.path.rsplit("/", 1)[-1] for n in children if n.kind == "group"]
    return NetcdfFile(dict(group_attrs), group_arrays(children), groups, fit_int32 or set())
