"""Oracles: what a mount must show (from numpy, zarr-python 3 and tensorstore) and what a store holds on disk.

Nothing here imports zarrfs: every expected value comes from elsewhere.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Names of metadata documents in every format: every other key under an array is a chunk.
METADATA_DOCS = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json", "meta", "attrs"})
# The NPY views of an array (view name -> element order); raw views have no header.
NPY_VIEWS = {"npy": "C", "npy-f": "F"}
RAW_VIEWS = {"raw": "C", "raw-f": "F"}


# --------------------------------------------------------------------------- arrays


def npy_bytes(value: np.ndarray) -> bytes:
    """What ``np.save`` writes for VALUE laid out in C order (the contract's ``.npy`` file)."""
    buf = io.BytesIO()
    np.save(buf, np.array(value, order="C", copy=True), allow_pickle=False)
    return buf.getvalue()


def open_zarr_array(store_root: Path, path: str):
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr.open_array(os.fspath(store_root / path) if path else os.fspath(store_root), mode="r")


def descr_json(dtype: np.dtype) -> Any:
    """``dtype_to_descr`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(np.lib.format.dtype_to_descr(dtype)))


@dataclass
class Expected:
    npy: bytes
    value: np.ndarray
    attributes: dict
    shape: list
    descr: Any
    chunks: list


def expected_for(store_root: Path, path: str) -> Expected:
    arr = open_zarr_array(store_root, path)
    value = arr[...]
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)
    meta = arr.metadata
    if meta.zarr_format == 2:
        chunks = list(meta.chunks)
    else:
        chunks = list(meta.chunk_grid.chunk_shape)  # the shard shape for sharded arrays
    return Expected(
        npy=npy_bytes(value),
        value=value,
        attributes=dict(arr.attrs.asdict()),
        shape=list(arr.shape),
        descr=descr_json(value.dtype),
        chunks=chunks,
    )


def zarr_value(store_root: Path, path: str) -> np.ndarray:
    """What zarr-python 3 reads for the whole array at PATH, opened afresh (no cache shared with earlier reads)."""
    arr = open_zarr_array(store_root, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(arr[...])


def zarr_chunk_key(store_root: Path, path: str, idx: tuple[int, ...]) -> str:
    """The store key (relative to the array) of grid position IDX, as zarr-python 3 encodes it."""
    return open_zarr_array(store_root, path).metadata.encode_chunk_key(tuple(idx))


def zarr_chunk_shape(store_root: Path, path: str) -> tuple[int, ...]:
    """The chunk grid's chunk shape (a shard for sharded v3 arrays), from zarr-python 3."""
    meta = open_zarr_array(store_root, path).metadata
    if meta.zarr_format == 2:
        return tuple(meta.chunks)
    return tuple(meta.chunk_grid.chunk_shape)


def tensorstore_value(store_root: Path, path: str, zarr_format: int) -> np.ndarray:
    """What tensorstore reads for the array at PATH (a second oracle; structured types field by field)."""
    import tensorstore as ts

    spec = {
        "driver": "zarr" if zarr_format == 2 else "zarr3",
        "kvstore": {"driver": "file", "path": os.fspath(Path(store_root) / path) + "/"},
    }
    meta_dtype = zarr_value(store_root, path).dtype if zarr_format == 2 else None
    if meta_dtype is not None and meta_dtype.names:
        out = None
        for name in meta_dtype.names:
            field_value = ts.open({**spec, "field": name}, read=True).result().read().result()
            if out is None:
                out = np.zeros(field_value.shape, meta_dtype)
            out[name] = field_value
        return out
    return np.asarray(ts.open(spec, read=True).result().read().result())


def npy_f_bytes(value: np.ndarray) -> bytes:
    """What numpy writes for VALUE as a Fortran-order NPY file (``fortran_order`` True even for 0-d/1-d)."""
    d = {"descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": True, "shape": value.shape}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue() + value.tobytes(order="F")


def view_bytes(value: np.ndarray, view: str) -> bytes:
    """The bytes a view file shows for VALUE: ``npy`` (np.save), ``npy-f``, ``raw`` or ``raw-f``."""
    if view == "npy":
        return npy_bytes(value)
    if view == "npy-f":
        return npy_f_bytes(value)
    return np.asarray(value).tobytes(order=RAW_VIEWS[view])


def view_header_len(value: np.ndarray, view: str) -> int:
    return len(view_bytes(value, view)) - value.nbytes


def value_from_view_bytes(data: bytes, view: str, like: np.ndarray) -> np.ndarray:
    """The array a view file's bytes describe (the inverse of ``view_bytes``), as a C-contiguous copy."""
    if view in NPY_VIEWS:
        out = np.load(io.BytesIO(data), allow_pickle=False)
    else:
        out = np.frombuffer(data, dtype=like.dtype).reshape(like.shape, order=RAW_VIEWS[view])
    return np.array(out, order="C", copy=True)  # ascontiguousarray would make 0-d 1-d


def patched(value: np.ndarray, view: str, offset: int, data: bytes) -> np.ndarray:
    """VALUE after DATA is written at OFFSET into its VIEW file (numpy's own reading of the patched bytes)."""
    b = bytearray(view_bytes(value, view))
    assert offset + len(data) <= len(b), "the oracle patch runs past the file"
    b[offset : offset + len(data)] = data
    return value_from_view_bytes(bytes(b), view, value)


def chunk_slices(idx: tuple[int, ...], chunks: tuple[int, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The region of grid position IDX, clipped at the array's edge."""
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape))


def chunk_file(mnt: Path, path: str, idx: tuple[int, ...]) -> Path:
    name = (".".join(map(str, idx)) or "0") + ".npy"
    return Path(mnt) / ".zarrfs" / "chunks" / path / name


def view_file(mnt: Path, path: str, view: str) -> Path:
    """The file of VIEW (``npy``, ``npy-f``, ``raw``, ``raw-f``) of the array at PATH."""
    if view == "npy":
        return Path(mnt) / (path + ".npy")
    suffix = ".npy" if view in NPY_VIEWS else ".raw"
    return Path(mnt) / ".zarrfs" / view / (path + suffix)


def element_diff(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when GOT and WANT have the same shape, dtype and bytes; else a description of the first difference."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    if got.size == 0:
        return None
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(got.size, -1)
    w = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(want.size, -1)
    bad = np.flatnonzero((g != w).any(axis=1))
    if bad.size == 0:
        return None
    first = np.unravel_index(bad[0], got.shape) if got.shape else ()
    return (
        f"{bad.size} of {got.size} elements differ; first at {tuple(int(i) for i in first)}: "
        f"got {got.reshape(-1)[bad[0]]!r}, want {want.reshape(-1)[bad[0]]!r}"
    )


def assert_same_array(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Byte equality of two arrays element by element (NaN payloads and -0.0 included)."""
    problem = element_diff(got, want)
    assert problem is None, f"{what}: {problem}"


def numpy_grey(values: np.ndarray) -> np.ndarray:
    """The previews' scaling rule written with numpy alone: 1st..99th percentile to 0..255, rounded."""
    finite = values[np.isfinite(values)]
    lo, hi = np.percentile(finite, [1, 99])
    return np.where(np.isnan(values), 0, np.clip(np.round((values - lo) / (hi - lo) * 255), 0, 255)).astype(np.uint8)


# --------------------------------------------------------------------------- stores on disk


def store_keys(root: Path, prefix: str = "") -> list[str]:
    """Every file under ROOT/PREFIX (read from the disk, not through a mount), relative to it, sorted."""
    base = Path(root) / prefix if prefix else Path(root)
    if not base.is_dir():
        return []
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() or p.is_symlink())


def chunk_keys(root: Path, prefix: str) -> list[str]:
    """The keys under PREFIX that are not metadata documents (an array's chunks), relative to PREFIX."""
    return [k for k in store_keys(root, prefix) if k.rsplit("/", 1)[-1] not in METADATA_DOCS]


def leftover_temp_files(root: Path) -> list[str]:
    """Files that look like an unfinished atomic write (``*.tmp``, ``*.partial``) anywhere in the store."""
    return [k for k in store_keys(root) if k.endswith((".tmp", ".partial"))]


def metadata_docs(root: Path, path: str) -> dict[str, bytes]:
    """The metadata documents directly under ROOT/PATH, byte for byte."""
    base = Path(root) / path if path else Path(root)
    return {n: (base / n).read_bytes() for n in sorted(METADATA_DOCS) if (base / n).is_file()}
