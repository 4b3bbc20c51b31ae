"""Write tests/fixtures/v3draft-2022-05/: Zarr v3 draft stores built from the spec text.

No writer ever produced the May 2022 core draft layout (zarr-python 2.12-2.18 wrote the
older `meta/root` one, see tests/fixtures/v3draft-zarr218/), so these stores are encoded
here by hand from the specification texts:

    zarr-core-v3.0-draft-2022-05.rst    "Zarr core specification (version 3.0)", May 2022
    zarr-core-protocol-v3.0-wip.rst     "Zarr core protocol version 3.0", work in progress

Only numpy, numcodecs, json and the standard library are used; zarrfs is not imported,
so the expected values are numpy's own: for every array the script makes the data,
encodes the chunks it decides to write, and saves (np.save, C order) the array a reader
must see: the data inside written chunks, the fill value everywhere else.

Run (from anywhere; paths are taken from this file's location; the output directory is
deleted and recreated):

    .venv/bin/python scripts/make_fixtures_v3draft_spec.py

Reproducibility: data are arange based; gzip streams are written with mtime 0; blosc
runs single-threaded. README.md in the output lists every fixture with the spec
section it follows.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import sys

import numcodecs
import numcodecs.blosc
import numpy as np

numcodecs.blosc.use_threads = False

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "v3draft-2022-05")
EXPECTED = os.path.join(OUT, "expected")

CORE_URI = "https://purl.org/zarr/spec/core/3.0"
PROTOCOL_URI = "http://purl.org/zarr/spec/protocol/core/3.0"  # as the protocol draft spells it
CODECS = "https://purl.org/zarr/spec/codecs"  # May 2022: `.../codecs/gzip/1.0`
SHARDING_URI = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
MAX_U64 = 2**64 - 1

CORE_ENTRY = {
    "zarr_format": CORE_URI,
    "metadata_encoding": {"type": "json", "metadata_key_suffix": ".json"},
    # the spec's own example of an extension that may be ignored
    "extensions": [{"extension": "http://example.org/zarr/extension/foo", "must_understand": False,
                    "configuration": {"foo": "bar"}}],
}


def codec(name: str, **config) -> dict:
    out = {"type": f"{CODECS}/{name}/1.0"}
    if config:
        out["configuration"] = config
    return out


GZIP1 = codec("gzip", level=1)
BLOSC_LZ4 = codec("blosc", cname="lz4", clevel=5, shuffle=1, blocksize=0)
ZSTD3 = codec("zstd", level=3, checksum=False)
CRC32C = codec("crc32c")


# --------------------------------------------------------------------------- encoding


def encode_bytes(data: bytes, entry: dict) -> bytes:
    """One bytes->bytes codec of a draft codec object (May 2022 `type` or protocol `codec`)."""
    uri = entry.get("type", entry.get("codec"))
    name = uri.rstrip("/").split("/")[-2] if uri.endswith("/1.0") else uri.rstrip("/").split("/")[-1]
    config = entry.get("configuration")
    if config is None:
        config = {k: v for k, v in entry.items() if k not in ("type", "codec")}
    if name == "gzip":
        return gzip.compress(data, compresslevel=config.get("level", 5), mtime=0)
    return bytes(numcodecs.get_codec({"id": name, **config}).encode(data))


def encode_core_chunk(chunk: np.ndarray, doc: dict) -> bytes:
    """Encode one chunk as the May 2022 draft's "Encoding procedure" says."""
    ndim = chunk.ndim
    a = chunk
    if doc["chunk_memory_layout"] == "F":
        a = a.transpose(tuple(range(ndim))[::-1])  # step 1: the dimension order is reversed
    endian = None
    out = None
    for entry in doc.get("codecs", []):
        name = entry["type"].split("/")[-2]
        config = entry.get("configuration", {})
        if name == "transpose":
            order = config["order"]
            perm = list(range(ndim)) if order == "C" else list(range(ndim))[::-1] if order == "F" else order
            a = a.transpose(perm)
        elif name == "endian":
            endian = config["endian"]
        else:
            if out is None:
                out = _to_bytes(a, endian)
            out = encode_bytes(out, entry)
    return out if out is not None else _to_bytes(a, endian)


def _to_bytes(a: np.ndarray, endian: str | None) -> bytes:
    """Elements in C order of the (possibly transposed) array, in the codec's byte order."""
    if endian is not None and a.dtype.itemsize > 1 and a.dtype.kind not in "V":
        a = a.astype(a.dtype.newbyteorder("<" if endian == "little" else ">"))
    return np.ascontiguousarray(a).tobytes()


def encode_protocol_chunk(chunk: np.ndarray, doc: dict) -> bytes:
    """The protocol draft: the chunk's bytes in its memory layout, then each chunk codec."""
    data = chunk.tobytes(order=doc["chunk_memory_layout"])
    for entry in doc.get("chunk_codecs", []):
        data = encode_bytes(data, entry)
    return data


def chunk_key(idx: tuple, sep: str, head: str, zero_d: str) -> str:
    return head + sep.join(map(str, idx)) if idx else zero_d


def grid_shape(shape, chunks):
    return tuple(-(-s // c) for s, c in zip(shape, chunks))


def all_chunks(shape, chunks):
    return [tuple(int(i) for i in idx) for idx in np.ndindex(*grid_shape(shape, chunks))]


def region(idx, shape, chunks):
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape))


def full_chunk(data, fill, idx, chunks):
    """Chunk `idx` at full chunk size: the data, and the fill value past the array's edge."""
    reg = region(idx, data.shape, chunks)
    chunk = np.full(chunks, fill, dtype=data.dtype)
    chunk[tuple(slice(0, r.stop - r.start) for r in reg)] = data[reg]
    return chunk


def sample(dtype: np.dtype, shape: tuple, seed: int) -> np.ndarray:
    """Deterministic values of `dtype` (arange based)."""
    n = math.prod(shape)
    x = np.arange(n, dtype=np.int64)
    if dtype.kind == "b":
        v = (x + seed) % 3 == 0
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        span = min(int(info.max) - int(info.min), 2**40)
        v = (x * 7919 + seed * 101) % span + int(info.min) if info.min < 0 else (x * 7919 + seed) % span
    elif dtype.kind == "f":
        v = (x - n / 2) * 0.375 + seed
    elif dtype.kind == "c":
        v = (x * 0.5 - seed) + 1j * (x * -0.25 + seed)
    elif dtype.kind == "V":
        raw = ((np.arange(n * dtype.itemsize) * 37 + seed) % 256).astype(np.uint8)
        return raw.view(dtype).reshape(shape)
    else:
        raise ValueError(dtype)
    return np.asarray(v).astype(dtype).reshape(shape)


# --------------------------------------------------------------------------- stores


class StoreWriter:
    """One fixture store: keys under OUT/<name>/, expectations in the index."""

    def __init__(self, name: str, family: str, entry: dict | None):
        self.name = name
        self.root = os.path.join(OUT, name)
        self.family = family  # "core" (meta/, data/) or "protocol" (meta/root, data/root)
        self.index = {"groups": {}, "implicit_groups": [], "arrays": {}, "refused": {}}
        os.makedirs(self.root)
        if entry is not None:
            self.put("zarr.json", entry)

    def put(self, key: str, value) -> None:
        path = os.path.join(self.root, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = value if isinstance(value, bytes) else (json.dumps(value, indent=4, sort_keys=True) + "\n").encode()
        with open(path, "wb") as f:
            f.write(data)

    def meta_key(self, path: str, kind: str) -> str:
        if self.family == "core":
            return f"meta/{kind}.json" if not path else f"meta/{path}.{kind}.json"
        return f"meta/root.{kind}.json" if not path else f"meta/root/{path}.{kind}.json"

    def data_prefix(self, path: str) -> str:
        base = "data" if self.family == "core" else "data/root"
        return f"{base}/{path}" if path else base

    def group(self, path: str, doc: dict) -> None:
        self.put(self.meta_key(path, "group"), doc)
        self.index["groups"][path] = doc.get("attributes", {})

    def implicit(self, *paths: str) -> None:
        self.index["implicit_groups"].extend(paths)

    def array(self, path: str, doc: dict, data: np.ndarray, fill, written="all", shards=None,
              key_style=("/", "c", "c"), refused: str | None = None) -> None:
        """Write an array document and the chunks in `written`; record what a reader must see.

        `key_style` is (default separator, head, 0-d key); `shards` is chunks_per_shard for
        the sharding transformer; `refused` is the text the refusal must name.
        """
        self.put(self.meta_key(path, "array"), doc)
        if refused is not None:
            self.index["refused"][path] = refused
            return
        shape, chunks = data.shape, tuple(doc["chunk_grid"]["chunk_shape"])
        sep = doc["chunk_grid"].get("separator", key_style[0])
        encode = encode_protocol_chunk if "chunk_codecs" in doc or "zarr_format" in doc else encode_core_chunk
        todo = all_chunks(shape, chunks) if written == "all" else [tuple(w) for w in written]
        expected = np.full(shape, fill, dtype=data.dtype)
        encoded = {}
        for idx in todo:
            reg = region(idx, shape, chunks)
            expected[reg] = data[reg]
            encoded[idx] = encode(full_chunk(data, fill, idx, chunks), doc)
        keys = []
        if shards is None:
            for idx, blob in encoded.items():
                key = f"{self.data_prefix(path)}/{chunk_key(idx, sep, key_style[1], key_style[2])}"
                self.put(key, blob)
                keys.append(key)
        else:
            keys = self._write_shards(path, encoded, shape, chunks, tuple(shards), sep, key_style)
        fname = path.replace("/", "__") or "root"
        os.makedirs(os.path.join(EXPECTED, self.name), exist_ok=True)
        np.save(os.path.join(EXPECTED, self.name, fname + ".npy"), expected.copy(order="C"))  # 0-d stays 0-d
        self.index["arrays"][path] = {
            "file": f"{self.name}/{fname}.npy", "attrs": doc.get("attributes", {}),
            "dtype": expected.dtype.str, "shape": list(shape), "keys": sorted(keys)}

    def _write_shards(self, path, encoded, shape, chunks, cps, sep, key_style):
        """Shards: inner chunks (in reverse C order, so offsets matter), then the index."""
        n_grid = grid_shape(shape, chunks)
        shard_grid = tuple(-(-g // n) for g, n in zip(n_grid, cps)) if cps else ()
        keys = []
        for sidx in (np.ndindex(*shard_grid) if cps else [()]):
            sidx = tuple(int(i) for i in sidx)
            index = np.full(cps + (2,), MAX_U64, dtype="<u8")
            blob = b""
            local_all = list(np.ndindex(*cps)) if cps else [()]
            for local in reversed(local_all):
                idx = tuple(s * n + i for s, n, i in zip(sidx, cps, local))
                if idx in encoded:
                    index[local] = (len(blob), len(encoded[idx]))
                    blob += encoded[idx]
            if not blob:
                continue  # a shard with no inner chunk is not stored
            key = f"{self.data_prefix(path)}/{chunk_key(sidx, sep, key_style[1], key_style[2])}"
            self.put(key, blob + index.tobytes())
            keys.append(key)
        return keys


def array_doc(shape, data_type, chunks, fill_value, codecs=None, layout="C", separator="/",
              attributes=None, **extra) -> dict:
    """A May 2022 array metadata document ("Array metadata")."""
    doc = {
        "shape": list(shape), "data_type": data_type,
        "chunk_grid": {"type": "regular", "chunk_shape": list(chunks), "separator": separator},
        "chunk_memory_layout": layout, "fill_value": fill_value, "extensions": [],
        "attributes": attributes if attributes is not None else {},
    }
    if codecs is not None:
        doc["codecs"] = codecs
    doc.update(extra)
    return doc


def write_core() -> dict:
    s = StoreWriter("core", "core", CORE_ENTRY)
    s.group("", {"attributes": {"title": "zarrfs v3 draft fixtures from the spec", "spec": "core 3.0, May 2022"}})
    s.group("grp", {"attributes": {"spam": "ham", "eggs": 42}})
    s.group("grp/sub", {"attributes": {"depth": 2}})
    s.group("codecs", {"attributes": {}})
    s.implicit("implicit", "implicit/deeper", "types", "zerod", "sharded")

    f8 = np.dtype("<f8")
    s.array("grp/gzip_f8",
            array_doc((13, 9), "float64", (5, 4), "NaN", [GZIP1],
                      attributes={"foo": 42, "bar": "apples", "baz": [1, 2, 3, 4]}),
            sample(f8, (13, 9), 1), np.nan, written=[(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 0), (2, 1)])
    # 0xfffffff9 is the bit pattern of -7 as int32
    s.array("grp/sub/blosc_i4", array_doc((20, 12), "int32", (8, 5), "0xfffffff9", [BLOSC_LZ4]),
            sample(np.dtype("<i4"), (20, 12), 2), np.array(0xFFFFFFF9, "<u4").view("<i4")[()],
            written=[(0, 0), (0, 1), (1, 2), (2, 0), (2, 2)])
    s.array("codecs/zstd_u2_F_dot", array_doc((9, 11), "uint16", (4, 4), "0xffff", [ZSTD3], layout="F",
                                              separator="."),
            sample(np.dtype("<u2"), (9, 11), 3), 0xFFFF, written=[(0, 0), (0, 2), (1, 1), (2, 0), (2, 2)])
    # 0b1111111111111110 is the bit pattern of -2 as int16
    s.array("codecs/endian_big_i2",
            array_doc((10, 7), "int16", (4, 3), "0b1111111111111110", [codec("endian", endian="big"), GZIP1]),
            sample(np.dtype("<i2"), (10, 7), 4), np.array(0b1111111111111110, "<u2").view("<i2")[()],
            written=[(0, 0), (0, 1), (1, 0), (1, 2), (2, 1)])
    s.array("codecs/transpose_f4",
            array_doc((6, 7, 5), "float32", (4, 3, 5), "-Infinity", [codec("transpose", order=[2, 0, 1]), ZSTD3]),
            sample(np.dtype("<f4"), (6, 7, 5), 5), -np.inf, written=[(0, 0, 0), (0, 2, 0), (1, 1, 0)])
    s.array("codecs/F_transpose_gzip_crc32c",
            array_doc((7, 5, 4), "float64", (3, 2, 4), "+Infinity",
                      [codec("transpose", order=[1, 0, 2]), GZIP1, CRC32C], layout="F"),
            sample(f8, (7, 5, 4), 6), np.inf, written=[(0, 0, 0), (1, 1, 0), (2, 2, 0), (2, 0, 0)])
    s.array("codecs/crc32c_u1", array_doc((30,), "uint8", (8,), 7, [CRC32C]),
            sample(np.dtype("u1"), (30,), 7), 7, written=[(0,), (1,), (3,)])
    s.array("types/bool_gzip", array_doc((5, 6), "bool", (2, 4), True, [GZIP1]),
            sample(np.dtype("?"), (5, 6), 0), True, written=[(0, 0), (1, 1), (2, 0)])
    s.array("types/complex64", array_doc((4, 5), "complex64", (3, 3), [1.5, -2.0], []),
            sample(np.dtype("<c8"), (4, 5), 1), 1.5 - 2j, written=[(0, 0), (1, 1)])
    s.array("types/int8_F", array_doc((5, 4), "int8", (2, 3), -128, None, layout="F"),
            sample(np.dtype("i1"), (5, 4), 2), -128, written=[(0, 0), (2, 1), (1, 0)])
    # An extension data type zarrfs does not know: the first known fallback (int16) is used.
    s.array("types/ext_fallback_list",
            array_doc((6, 5), {"extension": "https://example.org/zarr/extensions/data-types/fixed-point/1.0",
                               "type": "q7.8", "fallback": ["q7.8-le", "int16"]}, (4, 4), 0, [ZSTD3]),
            sample(np.dtype("<i2"), (6, 5), 3), 0, written=[(0, 0), (1, 1)])
    # The spec's own example of an extension data type: datetime with fallback "<i8", fill null.
    s.array("types/datetime_fallback",
            array_doc((6,), {"extension": "https://purl.org/zarr/spec/extensions/data-types/datetime/1.0",
                             "type": "<M8[ns]", "fallback": "<i8"}, (4,), None, [GZIP1]),
            sample(np.dtype("<i8"), (6,), 4), 0, written=[(0,)])
    # Raw bits: r24 is a 3-byte opaque type; 0x hex digits are the bytes in order.
    s.array("types/raw_r24", array_doc((7,), "r24", (3,), "0x010203", []),
            sample(np.dtype("V3"), (7,), 5), np.void(b"\x01\x02\x03"), written=[(0,), (2,)])
    s.array("zerod/written", array_doc((), "float64", (), "NaN", []),
            np.array(3.25, dtype=f8), np.nan, written=[()])
    s.array("zerod/unwritten_hexfill", array_doc((), "int32", (), "0x0000002a", [GZIP1]),
            np.array(5, dtype="<i4"), 42, written=[])
    s.array("implicit/deeper/int16_dot", array_doc((12,), "int16", (5,), 0, [GZIP1], separator="."),
            sample(np.dtype("<i2"), (12,), 6), 0)

    sharding = [{"extension": SHARDING_URI, "type": "indexed", "configuration": {"chunks_per_shard": [2, 2]}}]
    # grid 5x4 inner chunks, shards of 2x2: shard grid 3x2; shard (0, 1) holds nothing
    # (no key); edge shards (2, *) keep their full 4-entry index.
    s.array("sharded/u2_blosc", array_doc((17, 18), "uint16", (4, 5), 9, [BLOSC_LZ4],
                                          storage_transformers=sharding),
            sample(np.dtype("<u2"), (17, 18), 7), 9, shards=[2, 2],
            written=[(0, 0), (0, 1), (1, 1), (2, 0), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3), (4, 0), (4, 3)])
    s.array("sharded/f4_F_dot",
            array_doc((10, 12), "float32", (3, 4), "NaN", [GZIP1], layout="F", separator=".",
                      storage_transformers=[{"extension": SHARDING_URI, "type": "indexed",
                                             "configuration": {"chunks_per_shard": [2, 3]}}]),
            sample(np.dtype("<f4"), (10, 12), 8), np.nan, shards=[2, 3],
            written=[(0, 0), (0, 2), (1, 1), (3, 0), (3, 2)])
    s.array("sharded/zerod",
            array_doc((), "int32", (), -1, [], storage_transformers=[
                {"extension": SHARDING_URI, "type": "indexed", "configuration": {"chunks_per_shard": []}}]),
            np.array(123456, dtype="<i4"), -1, shards=[], written=[()])
    return s.index


def write_root_array() -> dict:
    s = StoreWriter("core-root-array", "core", {"zarr_format": CORE_URI,
                                                "metadata_encoding": {"type": "json", "metadata_key_suffix": ".json"},
                                                "extensions": []})
    s.array("", array_doc((5, 6), "int32", (2, 4), -1, [GZIP1], attributes={"root": "array"}),
            sample(np.dtype("<i4"), (5, 6), 9), -1, written=[(0, 0), (0, 1), (2, 1)])
    return s.index


REQUIRED_EXTENSION = "https://example.org/zarr/extension/needs-understanding"


def write_refuse_extension() -> dict:
    s = StoreWriter("refuse-extension", "core", {
        "zarr_format": CORE_URI, "metadata_encoding": {"type": "json", "metadata_key_suffix": ".json"},
        "extensions": [{"extension": REQUIRED_EXTENSION, "must_understand": True}]})
    s.group("", {"attributes": {"note": "never mounted: the entry point requires an unknown extension"}})
    s.array("a", array_doc((4,), "int32", (2,), 0, [GZIP1]), sample(np.dtype("<i4"), (4,), 0), 0)
    s.index["refused_mount"] = REQUIRED_EXTENSION
    return s.index


def write_refused_arrays() -> dict:
    s = StoreWriter("refused-arrays", "core", {"zarr_format": CORE_URI,
                                               "metadata_encoding": {"type": "json", "metadata_key_suffix": ".json"},
                                               "extensions": []})
    s.group("", {"attributes": {"note": "every array but `ok` must be refused, and `ok` stays readable"}})
    s.array("ok", array_doc((6,), "int8", (4,), 3, [GZIP1]), sample(np.dtype("i1"), (6,), 1), 3)
    data, fill = sample(np.dtype("<i4"), (4,), 0), 0
    transformer = "https://example.org/zarr/storage_transformers/encrypted/1.0"
    s.array("unknown_transformer", array_doc((4,), "int32", (2,), 0, [GZIP1], storage_transformers=[
        {"extension": transformer, "type": "aes", "configuration": {"key_id": 1}}]), data, fill, refused=transformer)
    s.array("unknown_field", array_doc((4,), "int32", (2,), 0, [GZIP1], dimension_names=["x"]), data, fill,
            refused="dimension_names")
    array_ext = "https://example.org/zarr/extension/array-bar"
    s.array("required_array_extension", array_doc((4,), "int32", (2,), 0, [GZIP1], extensions=[
        {"extension": array_ext, "must_understand": True}]), data, fill, refused=array_ext)
    dtype_ext = "https://example.org/zarr/extensions/data-types/no-fallback/1.0"
    s.array("unknown_dtype_no_fallback", array_doc((4,), {"extension": dtype_ext, "type": "x"}, (2,), 0, [GZIP1]),
            data, fill, refused=dtype_ext)
    grid_ext = "https://example.org/zarr/extensions/chunk-grids/rectilinear/1.0"
    doc = array_doc((4,), "int32", (2,), 0, [GZIP1])
    doc["chunk_grid"] = {"extension": grid_ext, "type": "rectilinear", "chunk_shapes": [[1, 3]]}
    s.array("chunk_grid_extension", doc, data, fill, refused=grid_ext)
    mystery = "https://example.org/zarr/codecs/mystery/1.0"
    s.array("unknown_codec", array_doc((4,), "int32", (2,), 0, [{"type": mystery}]), data, fill, refused=mystery)
    return s.index


def write_protocol() -> dict:
    entry = {"zarr_format": PROTOCOL_URI, "metadata_encoding": PROTOCOL_URI, "metadata_key_suffix": ".json",
             "extensions": []}
    s = StoreWriter("protocol", "protocol", entry)
    style = (".", "", "0")  # protocol draft chunk identifiers: "1.23.45"
    s.group("", {"zarr_format": PROTOCOL_URI, "extensions": [], "attributes": {"spam": "ham", "eggs": 42}})
    s.implicit("nested")
    example = {  # the protocol draft's array example, scaled down
        "zarr_format": PROTOCOL_URI, "shape": [25, 10], "data_type": "<f8",
        "chunk_grid": {"type": "regular", "chunk_shape": [10, 4]}, "chunk_memory_layout": "C",
        "chunk_codecs": [{"codec": "http://purl.org/zarr/spec/codec/gzip", "level": 1}],
        "fill_value": "NaN", "extensions": [], "attributes": {"foo": 42, "bar": "apples", "baz": [1, 2, 3, 4]}}
    s.array("example", example, sample(np.dtype("<f8"), (25, 10), 2), np.nan, key_style=style,
            written=[(0, 0), (0, 1), (1, 2), (2, 0), (2, 2)])
    be = {"zarr_format": PROTOCOL_URI, "shape": [7, 6], "data_type": ">i4",
          "chunk_grid": {"type": "regular", "chunk_shape": [3, 4]}, "chunk_memory_layout": "F",
          "chunk_codecs": [], "fill_value": -3, "extensions": [], "attributes": {}}
    s.array("be_i4_F", be, sample(np.dtype(">i4"), (7, 6), 3), -3, key_style=style,
            written=[(0, 0), (1, 1), (2, 0)])
    u1 = {"zarr_format": PROTOCOL_URI, "shape": [12], "data_type": "u1",
          "chunk_grid": {"type": "regular", "chunk_shape": [5]}, "chunk_memory_layout": "C",
          "chunk_codecs": [{"codec": "http://purl.org/zarr/spec/codec/zlib", "level": 6},
                           {"codec": "http://purl.org/zarr/spec/codec/crc32c"}],
          "fill_value": 200, "extensions": [], "attributes": {"note": "two chunk codecs"}}
    s.array("nested/u1_zlib_crc32c", u1, sample(np.dtype("u1"), (12,), 4), 200, key_style=style,
            written=[(0,), (2,)])
    return s.index


README = """# Zarr v3 draft fixtures written from the spec text

Generated by `scripts/make_fixtures_v3draft_spec.py` (numpy {numpy}, numcodecs {numcodecs},
Python {python}); do not edit by hand, rerun the script. No writer produced the May 2022
layout, so the script encodes these stores itself from the seed specs
(`zarr-core-v3.0-draft-2022-05.rst`, "Zarr core specification (version 3.0)", cited as
**core**; `zarr-core-protocol-v3.0-wip.rst`, "Zarr core protocol version 3.0", cited as
**protocol**). zarrfs is not used to write them: `expected/<store>/<path with / as __>.npy`
is `np.save` (C order) of the values the script encoded, the fill value outside the
chunks it wrote. `expected/index.json` has per store: `groups` (path -> attributes,
`""` the root), `implicit_groups`, `arrays` (path -> `file`, `attrs`, `dtype`, `shape`,
stored `keys`), `refused` (path -> text the refusal must name) and, for a store that
must not mount, `refused_mount`.

## Stores

### `core/`: the May 2022 layout

- Entry point `zarr.json` with `zarr_format` `https://purl.org/zarr/spec/core/3.0`,
  `metadata_encoding` `{{"type": "json", "metadata_key_suffix": ".json"}}` and the
  spec's example extension with `must_understand: false` (to be ignored).
  Core "Metadata / Entry point metadata" (`zarr_format`, `metadata_encoding`, `extensions`).
- Keys: root group `meta/group.json`, groups `meta/grp.group.json`, arrays
  `meta/grp/gzip_f8.array.json`, chunks `data/grp/gzip_f8/c0/1`. Core "Storage /
  Storage keys" (the tables "Metadata Storage Key example", "Data Storage Key example").
- Groups with attributes (`grp` holds the spec's example `spam`/`eggs`): core
  "Metadata / Group metadata". Implicit groups `implicit`, `implicit/deeper`, `types`,
  `zerod`, `sharded` (no document, implied by descendants): core "Storage / Operations",
  "Discover children of a group".
- Chunk identifiers `c` + indices joined by the grid's `separator` (`/` by default, `.`
  in `codecs/zstd_u2_F_dot`, `implicit/deeper/int16_dot`, `sharded/f4_F_dot`); a 0-d
  array's only chunk is `c` (`zerod/written`): core "Chunk grids / Regular grids" and its
  note on 0-dimensional arrays; `separator` in core "Array metadata / chunk_grid".
- Edge chunks are stored whole, the overhang holding the fill value: core "Regular
  grids", note on border chunks.
- Codecs by URI `https://purl.org/zarr/spec/codecs/NAME/1.0` with a `configuration`:
  gzip (`grp/gzip_f8`), blosc (`grp/sub/blosc_i4`, numcodecs' configuration with an
  integer `shuffle`), zstd, `endian` big (`codecs/endian_big_i2`), `transpose` (a
  permutation; the encoded array is `a.transpose(order)`, as in the final v3 codec),
  crc32c (4 bytes, little endian, appended). Core "Chunk encoding" ("Determination of
  encoded representations", "Encoding procedure", "Specifying codecs") and "Array
  metadata / codecs"; the codecs themselves are specified outside the core text.
- `chunk_memory_layout` `F` (`codecs/zstd_u2_F_dot`, `types/int8_F`,
  `codecs/F_transpose_gzip_crc32c` where a transpose codec follows the F layout's
  reversal, `sharded/f4_F_dot`): core "Chunk memory layouts" and "Chunk encoding", step 1
  (the dimension order is reversed before the first codec).
- `fill_value` strings `"NaN"`, `"+Infinity"`, `"-Infinity"`, hex `"0xfffffff9"` (int32
  -7), `"0xffff"` (uint16), `"0x0000002a"` (int32 42, `zerod/unwritten_hexfill`, never
  written), binary `"0b1111111111111110"` (int16 -2), `true` for bool, `null` in the spec's
  own datetime example: core "Array metadata / fill_value". For integers the 0x/0b
  string is the two's complement bit pattern of the element; for the raw `r24` type
  (`"0x010203"`) the hex digits are the element's bytes in the order written (the text
  does not say which byte comes first; this is zarrfs' reading). `types/complex64` uses
  `[real, imag]`, a form the core text does not define (zarr 2.18 and final v3 use it).
- Data types: core names `float64`, `int32`, `uint16`, `int16`, `float32`, `uint8`,
  `bool`, `complex64`, `int8`, raw `r24`; extension data types with `fallback`: a list
  (`types/ext_fallback_list`: `["q7.8-le", "int16"]`, the first known one is `int16`)
  and the spec's datetime example (`types/datetime_fallback`, fallback `"<i8"`). Core
  "Data types / Core data types" and "Array metadata / data_type".
- Sharding storage transformer `https://purl.org/zarr/spec/storage_transformers/sharding/1.0`,
  type `indexed`, `chunks_per_shard`: core "Storage transformers / Predefined storage
  transformers" (the sharding transformer, pending as ZEP 2; its layout as the extension
  draft and zarr 2.18 define it, see tests/fixtures/v3draft-zarr218/README.md). The grid
  chunk is the inner chunk; a shard's key is the chunk key of (chunk index //
  chunks_per_shard); the shard is the inner chunks (written here in reverse C order)
  followed by an index of (offset, nbytes) little-endian uint64 per inner chunk in C
  order, 2^64-1 twice for an absent one. `sharded/u2_blosc` has absent inner chunks,
  a shard with no chunk (no key) and edge shards with full indices; `sharded/zerod` a
  0-d array (`chunks_per_shard` `[]`, shard key `c`).

### `core-root-array/`: a root array

`meta/array.json` and chunk keys `data/c0/0`: core "Storage keys" ("If the root node is
an array, the metadata key is meta/array.json, and the data keys are formed by
concatenating "data/" and the chunk identifier").

### `refuse-extension/`: the mount is refused

The entry point lists `{REQUIRED_EXTENSION}` with
`must_understand: true`: core "Entry point metadata / extensions" ("processing must
terminate and an appropriate error raised").

### `refused-arrays/`: arrays refused one by one

`ok` stays readable; each other array must be refused, naming the cause:
- `unknown_transformer`: a storage transformer zarrfs does not know (core "Extensions":
  storage transformers are always required).
- `unknown_field`: a name (`dimension_names`) the draft does not define (core "Array
  metadata": "An implementation must fail to open ... arrays with unknown metadata fields").
- `required_array_extension`: an array extension with `must_understand: true` (core
  "Array metadata / extensions", "Extensions").
- `unknown_dtype_no_fallback`: an extension data type without `fallback` (core
  "Extensions": a data type extension is required when there is no fallback).
- `chunk_grid_extension`: a chunk grid extension (core "Extensions": always required).
- `unknown_codec`: a codec URI zarrfs cannot decode (core "Specifying codecs").

### `protocol/`: core protocol draft documents

Documents that carry `zarr_format` `http://purl.org/zarr/spec/protocol/core/3.0`
themselves, `extensions` and `attributes` (protocol "Metadata", "Group metadata"); arrays
with `chunk_codecs` of `{{"codec": URI, ...configuration inline}}` (protocol "Array
metadata", `chunk_codecs`; `example` is the draft's own example, scaled down), numpy
type strings `<f8`, `>i4`, `u1` (protocol "Core data types"), `chunk_memory_layout` F
(protocol "Memory layouts"), and chunk identifiers joined by the default separator `.`
without a prefix (`1.0`; protocol "Regular grids"). The protocol draft leaves "Store
interface" and "Storage protocol" as TODO, so the store uses the layout of the drafts
before May 2022 (core change log: "Removed the /root prefix for paths"), as zarr 2.18
implements it: entry point `zarr.json` with a top-level `metadata_key_suffix`, the root
group at `meta/root.group.json`, nodes at `meta/root/P.array.json`, chunks under
`data/root/P/`; `nested` is an implicit group.

## Every key with its size in bytes

```
{keys}
```
"""


def main() -> int:
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(EXPECTED)
    index = {
        "core": write_core(),
        "core-root-array": write_root_array(),
        "refuse-extension": write_refuse_extension(),
        "refused-arrays": write_refused_arrays(),
        "protocol": write_protocol(),
    }
    index["writer"] = f"numpy {np.__version__}, numcodecs {numcodecs.__version__}"
    with open(os.path.join(EXPECTED, "index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    lines = []
    for dirpath, _, files in sorted(os.walk(OUT)):
        for name in sorted(files):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, OUT)
            if not rel.startswith("expected") and rel != "README.md":
                lines.append(f"{os.path.getsize(full):7d}  {rel}")
    text = README.format(numpy=np.__version__, numcodecs=numcodecs.__version__,
                         python=sys.version.split()[0], REQUIRED_EXTENSION=REQUIRED_EXTENSION,
                         keys="\n".join(sorted(lines, key=lambda ln: ln[9:])))
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(text)
    total = sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(OUT) for n in fs)
    print(f"wrote {OUT}: {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
