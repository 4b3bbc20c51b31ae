"""Zarr hierarchies the tests mount, written with zarr-python 3: the varied test hierarchy and its arrays.

Nothing here imports zarrfs.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from support.oracles import Expected, expected_for


@dataclass(frozen=True)
class ArraySpec:
    path: str
    dtype: Any
    shape: tuple
    chunks: tuple
    codec: str = "none"
    fill_value: Any = None
    write: Any = "all"  # "all", "none", or a tuple of slices
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    attributes: dict | None = field(default=None, hash=False, compare=False)


ARRAY_ATTRS = {
    "units": "m/s",
    "scale": 0.5,
    "tags": ["a", "b"],
    "nested": {"x": None, "ok": True},
    "label": "µm – 中文",
}
ROOT_ATTRS = {"title": "zarrfs test hierarchy", "version": 1, "nested": {"list": [1, 2.5, None, "é"]}}
GROUP_ATTRS = {
    "dtypes": {"kind": "dtypes"},
    "codecs": {"kind": "codecs", "n": 6},
    "fill": {"kind": "fill"},
    "edge": {},
    "names": {"kind": "names"},
    "empty_group": {"empty": True},
    "implied/b": {"level": 2},
}
# Groups whose metadata documents are deleted after building, so only a descendant implies them.
IMPLIED_GROUPS = ["implied", "deep", "deep/x", "deep/x/y"]

# Shape of the per-codec arrays: several FUSE requests long, edge chunks on both axes.
CODEC_SHAPE = (300, 257)
CODEC_CHUNKS = (64, 50)


def _dtype_cases(zarr_format: int) -> list[tuple[str, Any]]:
    cases = [
        ("bool", "bool"),
        ("int8", "int8"),
        ("uint16", "uint16"),
        ("int32", "int32"),
        ("int64", "int64"),
        ("uint64", "uint64"),
        ("float16", "float16"),
        ("float32", "float32"),
        ("float64", "float64"),
        ("complex64", "complex64"),
        ("complex128", "complex128"),
        ("bytes_S5", "S5"),
        ("unicode_U3", "<U3"),
        ("datetime64_ns", "datetime64[ns]"),
    ]
    if zarr_format == 2:
        cases += [("int32_be", ">i4"), ("float64_be", ">f8"), ("structured", [("a", "<i4"), ("b", "<f8")])]
    return cases


def array_specs(zarr_format: int, *, implied: bool = True) -> list[ArraySpec]:
    """Every array of the test hierarchy for ZARR_FORMAT (static, so tests can be parametrized on it)."""
    specs: list[ArraySpec] = []
    codecs = ["none", "blosc", "zstd", "gzip"]
    for i, (name, dt) in enumerate(_dtype_cases(zarr_format)):
        specs.append(ArraySpec(f"dtypes/{name}", dt, (37, 23), (10, 7), codecs[i % 4]))

    for codec in codecs + (["crc32c", "zstd_crc32c"] if zarr_format == 3 else []):
        specs.append(ArraySpec(f"codecs/{codec}", "float64", CODEC_SHAPE, CODEC_CHUNKS, codec))
    if zarr_format == 2:
        specs += [
            ArraySpec("codecs/order_f_blosc", "int32", (37, 23), (10, 7), "blosc", kwargs={"order": "F"}),
            ArraySpec("codecs/order_f_none", "float32", (37, 23), (10, 7), "none", kwargs={"order": "F"}),
            ArraySpec("codecs/order_f_3d", "int16", (5, 6, 7), (2, 4, 3), "zstd", kwargs={"order": "F"}),
            ArraySpec(
                "codecs/sep_slash",
                "int16",
                (37, 23),
                (10, 7),
                "gzip",
                kwargs={"chunk_key_encoding": {"name": "v2", "separator": "/"}},
            ),
            ArraySpec(
                "codecs/sep_dot",
                "int16",
                (37, 23),
                (10, 7),
                "zstd",
                kwargs={"chunk_key_encoding": {"name": "v2", "separator": "."}},
            ),
        ]
    else:
        specs += [
            # Shards of 20x14 holding 5x7 inner chunks; only two regions written, so some
            # inner chunks of written shards and whole shards are missing.
            ArraySpec(
                "codecs/sharded",
                "float32",
                (37, 23),
                (5, 7),
                "zstd",
                fill_value=-1.5,
                write=(slice(0, 10), slice(0, 7)),
                kwargs={"shards": (20, 14)},
            ),
            ArraySpec(
                "codecs/sharded_blosc",
                "int32",
                (60, 45),
                (5, 7),
                "blosc",
                fill_value=3,
                write=(slice(22, 60), slice(0, 45)),
                kwargs={"shards": (20, 14)},
            ),
            ArraySpec(
                "codecs/sharded_index_start",
                "int16",
                (37, 23),
                (20, 14),
                "none",
                write=(slice(0, 37), slice(0, 9)),
                kwargs={"sharding_index_start": (5, 7)},
            ),
            ArraySpec("codecs/bytes_big_endian", "int32", (37, 23), (10, 7), "gzip", kwargs={"big_endian": True}),
            ArraySpec("codecs/transpose", "float32", (37, 23), (10, 7), "zstd", kwargs={"transpose": (1, 0)}),
            ArraySpec(
                "codecs/key_v2_dot",
                "int16",
                (37, 23),
                (10, 7),
                "gzip",
                kwargs={"chunk_key_encoding": {"name": "v2", "separator": "."}},
            ),
            ArraySpec(
                "codecs/key_default_dot",
                "int16",
                (37, 23),
                (10, 7),
                "zstd",
                kwargs={"chunk_key_encoding": {"name": "default", "separator": "."}},
            ),
            ArraySpec(
                "codecs/dimension_names", "uint8", (37, 23), (10, 7), "none", kwargs={"dimension_names": ["y", "x"]}
            ),
        ]

    specs += [
        ArraySpec(
            "fill/nan",
            "float64",
            (37, 23),
            (10, 7),
            "zstd",
            fill_value=float("nan"),
            write=(slice(0, 10), slice(0, 14)),
        ),
        ArraySpec(
            "fill/neg_inf",
            "float32",
            (37, 23),
            (10, 7),
            "none",
            fill_value=float("-inf"),
            write=(slice(10, 30), slice(7, 23)),
        ),
        ArraySpec(
            "fill/int_nonzero", "int32", (37, 23), (10, 7), "blosc", fill_value=-7, write=(slice(0, 10), slice(0, 7))
        ),
        ArraySpec(
            "fill/bool_true", "bool", (37, 23), (10, 7), "none", fill_value=True, write=(slice(20, 37), slice(0, 23))
        ),
        ArraySpec("fill/never_written", "float32", (37, 23), (10, 7), "gzip", fill_value=2.25, write="none"),
        ArraySpec("fill/scalar_0d", "float64", (), (), "none", fill_value=0.0),
        ArraySpec("fill/scalar_0d_unwritten", "int16", (), (), "zstd", fill_value=12, write="none"),
        ArraySpec("edge/vector", "float64", (1001,), (100,), "blosc"),
        ArraySpec("edge/chunk_bigger_than_shape", "int64", (5, 3), (10, 10), "zstd"),
        ArraySpec("edge/tiny_chunks", "uint16", (3, 4), (1, 1), "none"),
        ArraySpec("edge/nd4", "float32", (3, 4, 5, 6), (2, 3, 2, 4), "gzip"),
        ArraySpec("edge/zero_size", "float64", (0, 5), (2, 2), "none"),
        ArraySpec("edge/one_element", "complex128", (1,), (1,), "none"),
        ArraySpec("names/with space", "int8", (4, 4), (2, 2), "none"),
        ArraySpec("names/ünïcode_名前", "int8", (4, 4), (2, 2), "none"),
        ArraySpec("top", "float64", (17, 5), (4, 4), "zstd", attributes={"where": "root level"}),
    ]
    if implied:
        specs += [
            ArraySpec("implied/b/c", "int32", (12, 7), (5, 5), "zstd", attributes={"implied": "parent"}),
            ArraySpec("deep/x/y/arr", "float32", (9,), (4,), "none"),
        ]
    return specs


def sample_data(dtype: np.dtype, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Deterministic, non-trivial values of DTYPE (native byte order converted at the end)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype.names:
        x = np.zeros(shape, dtype)
        for name in dtype.names:
            x[name] = sample_data(dtype[name], shape, rng)
        return x
    kind = dtype.kind
    native = dtype.newbyteorder("=")
    if kind == "b":
        x = rng.random(shape) > 0.5
    elif kind in "iu":
        info = np.iinfo(native)
        x = rng.integers(info.min, info.max, shape, dtype=native, endpoint=True)
    elif kind == "f":
        x = (rng.standard_normal(shape) * 100).astype(native)
    elif kind == "c":
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(native)
    elif kind == "S":
        words = [b"ab", b"hello", b"", b"x\x00y", b"\xff\x01"]
        x = np.array([words[i % len(words)] for i in range(n)], dtype=dtype).reshape(shape)
    elif kind == "U":
        words = ["ab", "é中\U0001f600", "", "xyz", "q"]
        x = np.array([words[i % len(words)] for i in range(n)], dtype=dtype).reshape(shape)
    elif kind == "M":
        x = rng.integers(-(2**62), 2**62, shape).astype(native)
    else:
        raise ValueError(f"no sample data for {dtype}")
    return np.asarray(x).astype(dtype)


def _compressors(codec: str, zarr_format: int):
    if codec == "none":
        return None
    if zarr_format == 2:
        import numcodecs

        return {
            "blosc": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
            "zstd": numcodecs.Zstd(level=1),
            "gzip": numcodecs.GZip(level=1),
        }[codec]
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    return {
        "blosc": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "zstd": [ZstdCodec(level=1)],
        "gzip": [GzipCodec(level=1)],
        "crc32c": [Crc32cCodec()],
        "zstd_crc32c": [ZstdCodec(level=1), Crc32cCodec()],
    }[codec]


def create_array(root: Path, spec: ArraySpec, zarr_format: int, rng: np.random.Generator):
    import zarr
    from zarr.codecs import BytesCodec, ShardingCodec, TransposeCodec

    kw = dict(spec.kwargs)
    args: dict[str, Any] = dict(
        store=os.fspath(root),
        name=spec.path or None,
        shape=spec.shape,
        dtype=spec.dtype,
        zarr_format=zarr_format,
        compressors=_compressors(spec.codec, zarr_format),
        attributes=spec.attributes if spec.attributes is not None else ARRAY_ATTRS,
    )
    if spec.fill_value is not None:
        args["fill_value"] = spec.fill_value
    if kw.pop("big_endian", False):
        args["serializer"] = BytesCodec(endian="big")
    if "transpose" in kw:
        args["filters"] = [TransposeCodec(order=kw.pop("transpose"))]
    if "sharding_index_start" in kw:
        inner = kw.pop("sharding_index_start")
        args["serializer"] = ShardingCodec(chunk_shape=inner, codecs=[BytesCodec()], index_location="start")
    args["chunks"] = spec.chunks if spec.shape else ()
    args.update(kw)
    if not spec.shape:
        args.pop("chunks")
    arr = zarr.create_array(**args)
    data = sample_data(np.dtype(spec.dtype), spec.shape, rng)
    if spec.write == "all":
        arr[...] = data
    elif spec.write != "none":
        arr[spec.write] = data[spec.write]
    return arr


@dataclass
class Hierarchy:
    root: Path
    zarr_format: int
    arrays: list[str]  # hierarchy paths of arrays
    groups: dict[str, dict]  # explicit groups (path, "" for the root) -> attributes
    implied_groups: list[str]
    _expected: dict = field(default_factory=dict, repr=False)

    def expected(self, path: str) -> Expected:
        if path not in self._expected:
            self._expected[path] = expected_for(self.root, path)
        return self._expected[path]

    def all_groups(self) -> list[str]:
        return sorted(set(self.groups) | set(self.implied_groups))

    def listing(self, group: str) -> list[str]:
        """The names a mount lists in GROUP's directory."""
        prefix = group + "/" if group else ""
        names = set()
        for g in self.all_groups():
            if g and g.startswith(prefix) and "/" not in g[len(prefix) :]:
                names.add(g[len(prefix) :])
        for a in self.arrays:
            if a.startswith(prefix) and "/" not in a[len(prefix) :]:
                names.add(a[len(prefix) :] + ".npy")
        return sorted(names)


def build_hierarchy(root: Path, zarr_format: int, *, implied: bool = True, seed: int = 20240601) -> Hierarchy:
    """Write the varied test hierarchy with zarr-python 3 into ROOT."""
    import zarr

    rng = np.random.default_rng(seed + zarr_format)
    specs = array_specs(zarr_format, implied=implied)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's "no v3 specification" warnings for S/U dtypes
        root_group = zarr.open_group(os.fspath(root), mode="w", zarr_format=zarr_format, attributes=ROOT_ATTRS)
        groups = {"": dict(ROOT_ATTRS)}
        for name, attrs in GROUP_ATTRS.items():
            if name.startswith("implied") and not implied:
                continue
            root_group.create_group(name, attributes=attrs)
            groups[name] = dict(attrs)
        for spec in specs:
            create_array(root, spec, zarr_format, rng)
    implied_groups = []
    if implied:
        for g in IMPLIED_GROUPS:
            for doc in ("zarr.json", ".zgroup", ".zattrs"):
                p = root / g / doc
                if p.exists():
                    p.unlink()
            groups.pop(g, None)
            implied_groups.append(g)
    # every other intermediate group zarr created for us is explicit, with empty attributes
    for spec in specs:
        parts = spec.path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            g = "/".join(parts[:i])
            if g not in groups and g not in implied_groups:
                groups[g] = {}
    return Hierarchy(root, zarr_format, [s.path for s in specs], groups, implied_groups)


def build_root_array(root: Path, zarr_format: int, seed: int = 7) -> np.ndarray:
    """A store whose root node is an array."""
    spec = ArraySpec("", "float32", (19, 11), (8, 4), "zstd", attributes={"root": "array"})
    create_array(root, spec, zarr_format, np.random.default_rng(seed))
    return expected_for(root, "").value


def write_vlen_string_array(root: Path, name: str, zarr_format: int):
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(
            store=os.fspath(root), name=name, shape=(6,), chunks=(4,), dtype=str, zarr_format=zarr_format
        )
        a[...] = np.array(["a", "bb", "", "dddd", "é", "xyz"], dtype=object)
    return a


def consolidate(root: Path, zarr_format: int) -> None:
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(os.fspath(root), zarr_format=zarr_format)
