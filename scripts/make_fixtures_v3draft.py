"""Write the Zarr v3 draft fixtures in tests/fixtures/v3draft-zarr218/ with zarr 2.18.

zarr-python 2.12 to 2.18 carry an "experimental" v3 implementation that follows
the v3 core protocol drafts of 2022 (`zarr.json`, `meta/root/...`,
`data/root/.../c0/1`) and the first sharding storage transformer. This script
writes one hierarchy with it, as a DirectoryStoreV3.

Create the venv (Python 3.11):

    python3.11 -m venv /tmp/venv-zarr218
    /tmp/venv-zarr218/bin/pip install 'zarr==2.18.*' 'numpy<2' pytest

(pytest is needed because zarr 2.18 imports zarr.tests.test_storage_v3, which
imports pytest, whenever it decodes array metadata holding storage_transformers.)

Run it (from anywhere; paths are taken from this file's location):

    /tmp/venv-zarr218/bin/python scripts/make_fixtures_v3draft.py

The script sets ZARR_V3_EXPERIMENTAL_API=1 and ZARR_V3_SHARDING=1 itself before
importing zarr. What it writes (the output directory is deleted and recreated):

    tests/fixtures/v3draft-zarr218/store/          the DirectoryStoreV3 (zarr.json,
                                                   meta/root..., data/root...)
    tests/fixtures/v3draft-zarr218/expected/<path with / as __>.npy
                                                   np.save of what zarr 2.18 reads back
    tests/fixtures/v3draft-zarr218/expected/index.json
                                                   arrays and groups: attrs, chunk keys
                                                   written, shards, defined regions
    tests/fixtures/v3draft-zarr218/README.md       every key with its size; quirks

Reproducibility: the data are fixed (arange based) and blosc runs single-threaded.
numcodecs' GZip leaves the gzip header's MTIME to the wall clock; while writing,
the script hands numcodecs a GzipFile whose mtime is fixed at 0 ("no time stamp"
in RFC 1952), the only change to the writer. For `fill_value: null` arrays the
script writes whole chunks only and sets the undefined elements (outside written
chunks, where zarr 2.18 returns uninitialised memory) to zero in the saved .npy.
"""

import os

os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"

import gzip  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402

import numcodecs  # noqa: E402
import numcodecs.blosc  # noqa: E402
import numcodecs.gzip  # noqa: E402
import numpy as np  # noqa: E402
import zarr  # noqa: E402
from numcodecs.compat import ensure_contiguous_ndarray  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)  # "experimental v3" notice

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "v3draft-zarr218")
STORE = os.path.join(OUT, "store")
EXPECTED = os.path.join(OUT, "expected")

NAN = float("nan")
INF = float("inf")
MAX_U64 = 2**64 - 1

LZ4_SHUFFLE = dict(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)

GROUPS = [
    ("", {"title": "zarrfs v3 draft fixtures", "writer": "zarr 2.18"}),
    ("group_a", {"description": "a nested group", "numbers": [1, 2, 3], "nested": {"k": "v"}}),
    ("group_a/sub", {"depth": 2}),
    ("dtypes", {}),
    ("filters", {"note": "filters live in the array's attributes.filters"}),
    ("order", {}),
    ("zerod", {}),
    ("sharded", {"transformer": "sharding/1.0 indexed"}),
]
# Parents of implicit/deeper/int8_gzip get no group document (implicit groups).
IMPLICIT_GROUPS = ["implicit", "implicit/deeper"]

# Each array: path, creation arguments, writes (selections as (start, stop) per
# dimension; None for a 0-d write), user attrs. For fill_value None the writes
# cover whole chunks (edge chunks clipped at the array's edge).
ARRAYS = [
    dict(path="group_a/sub/int32_blosc", dtype="<i4", shape=(26, 34), chunks=(10, 12),
         compressor=numcodecs.Blosc(**LZ4_SHUFFLE), fill_value=7, order="C",
         writes=[((0, 20), (0, 24)), ((25, 26), (33, 34)), ((6, 8), (26, 30))], attrs={"units": "counts", "scale": 0.5}),
    dict(path="group_a/float64_nan_zlib", dtype="<f8", shape=(13, 17), chunks=(5, 6),
         compressor=numcodecs.Zlib(level=1), fill_value=NAN, order="C",
         writes=[((0, 10), (0, 12)), ((12, 13), (16, 17)), ((3, 4), (13, 15))],
         attrs={"long_name": "float64 with NaN fill"}),
    dict(path="dtypes/complex128_gzip", dtype="<c16", shape=(6, 7), chunks=(4, 3),
         compressor=numcodecs.GZip(level=5), fill_value=1.5 - 2j, order="C",
         writes=[((0, 4), (0, 7))]),
    dict(path="dtypes/bool_zstd", dtype="|b1", shape=(6, 10), chunks=(4, 4),
         compressor=numcodecs.Zstd(level=1), fill_value=True, order="C",
         writes=[((0, 4), (0, 8)), ((5, 6), (9, 10))]),
    dict(path="dtypes/be_int32_none", dtype=">i4", shape=(9, 11), chunks=(4, 4),
         compressor=None, fill_value=-1, order="C",
         writes=[((0, 9), (0, 8))]),
    dict(path="dtypes/struct_blosc", dtype=[("x", "<i4"), ("y", "<f8"), ("tag", "S2")],
         shape=(40,), chunks=(16,),
         compressor=numcodecs.Blosc(**LZ4_SHUFFLE), fill_value=(1, 2.5, b"ok"), order="C",
         writes=[((0, 24),)]),
    dict(path="dtypes/bytes_S5_zlib", dtype="|S5", shape=(11,), chunks=(4,),
         compressor=numcodecs.Zlib(level=1), fill_value=b"ab", order="C",
         writes=[((0, 6),)]),
    dict(path="dtypes/bytes_S4_blosc", dtype="|S4", shape=(90,), chunks=(40,),
         compressor=numcodecs.Blosc(**LZ4_SHUFFLE), fill_value=b"abcd", order="C",
         writes=[((40, 90),)]),
    dict(path="dtypes/uint8_lz4", dtype="|u1", shape=(40,), chunks=(16,),
         compressor=numcodecs.LZ4(acceleration=1), fill_value=255, order="C",
         writes=[((0, 20),)]),
    dict(path="dtypes/int16_bz2", dtype="<i2", shape=(7, 9), chunks=(3, 4),
         compressor=numcodecs.BZ2(level=9), fill_value=0, order="C",
         writes=[((0, 6), (0, 8)), ((6, 7), (8, 9))]),
    dict(path="dtypes/float32_lzma", dtype="<f4", shape=(7, 9), chunks=(3, 4),
         compressor=numcodecs.LZMA(preset=1), fill_value=-INF, order="C",
         writes=[((0, 6), (0, 8))]),
    dict(path="dtypes/float64_nullfill_zstd", dtype="<f8", shape=(10, 10), chunks=(3, 3),
         compressor=numcodecs.Zstd(level=3), fill_value=None, order="C",
         writes=[((0, 3), (0, 3)), ((3, 6), (6, 9)), ((9, 10), (9, 10)), ((9, 10), (0, 3))]),
    dict(path="dtypes/uint64_maxfill_blosc", dtype="<u8", shape=(10, 8), chunks=(4, 6),
         compressor=numcodecs.Blosc(cname="zstd", clevel=1, shuffle=numcodecs.Blosc.BITSHUFFLE),
         fill_value=MAX_U64, order="C",
         writes=[((0, 8), (0, 6))]),
    dict(path="filters/delta_zlib", dtype="<i4", shape=(30,), chunks=(8,),
         compressor=numcodecs.Zlib(level=1), fill_value=0, order="C",
         filters=[numcodecs.Delta(dtype="<i4")],
         writes=[((0, 20),)], attrs={"user": "attribute next to filters"}),
    dict(path="filters/scaleoffset_delta_blosc_F", dtype="<f8", shape=(12, 14), chunks=(8, 6),
         compressor=numcodecs.Blosc(**LZ4_SHUFFLE), fill_value=0.0, order="F",
         filters=[numcodecs.FixedScaleOffset(offset=1, scale=10, dtype="<f8", astype="<i4"),
                  numcodecs.Delta(dtype="<i4")],
         writes=[((0, 12), (0, 10))]),
    dict(path="order/int16_F_blosc", dtype="<i2", shape=(10, 12, 14), chunks=(4, 6, 7),
         compressor=numcodecs.Blosc(**LZ4_SHUFFLE), fill_value=-5, order="F",
         writes=[((0, 8), (0, 12), (0, 7)), ((9, 10), (5, 12), (10, 14))]),
    dict(path="order/float32_F_zlib", dtype="<f4", shape=(9, 11), chunks=(4, 5),
         compressor=numcodecs.Zlib(level=1), fill_value=NAN, order="F",
         writes=[((0, 8), (0, 10)), ((8, 9), (10, 11))]),
    dict(path="order/uint16_F_none", dtype="<u2", shape=(9, 11), chunks=(4, 4),
         compressor=None, fill_value=65535, order="F",
         writes=[((0, 9), (0, 8))]),
    dict(path="zerod/float64_written", dtype="<f8", shape=(), chunks=(),
         compressor=numcodecs.Zlib(level=1), fill_value=NAN, order="C",
         writes=[None], attrs={"note": "compressor requested, dropped by zarr 2.18 for 0-d"}),
    dict(path="zerod/int32_unwritten", dtype="<i4", shape=(), chunks=(),
         compressor=None, fill_value=42, order="C", writes=[]),
    dict(path="sharded/uint16_blosc", dtype="<u2", shape=(36, 36), chunks=(8, 10),
         compressor=numcodecs.Blosc(**LZ4_SHUFFLE), fill_value=0, order="C",
         chunks_per_shard=(2, 2),
         writes=[((0, 8), (0, 10)), ((16, 36), (20, 36))]),
    dict(path="sharded/float32_zlib_F", dtype="<f4", shape=(10, 12), chunks=(3, 4),
         compressor=numcodecs.Zlib(level=1), fill_value=NAN, order="F",
         chunks_per_shard=(2, 2),
         writes=[((0, 6), (0, 8)), ((9, 10), (11, 12))]),
    dict(path="sharded/int32_1d_none", dtype="<i4", shape=(50,), chunks=(5,),
         compressor=None, fill_value=-1, order="C", chunks_per_shard=(4,),
         writes=[((0, 20),), ((35, 42),)]),
    dict(path="sharded/int32_0d", dtype="<i4", shape=(), chunks=(),
         compressor=None, fill_value=3, order="C", chunks_per_shard=(),
         writes=[None]),
    dict(path="implicit/deeper/int8_gzip", dtype="|i1", shape=(12,), chunks=(5,),
         compressor=numcodecs.GZip(level=1), fill_value=0, order="C",
         writes=[((0, 12),)]),
]


class _FixedMtimeGzipFile(gzip.GzipFile):
    """GzipFile with the header time stamp fixed (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("mtime", 0)
        super().__init__(*args, **kwargs)


def source_values(dtype, shape):
    """Distinct, deterministic values (so C and F layouts of a chunk differ)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    idx = np.arange(n, dtype=np.int64)
    if dt.fields is not None:
        out = np.zeros(n, dtype=dt)
        for k, name in enumerate(dt.names):
            out[name] = _values(dt[name], idx, k)
        return out.reshape(shape)
    return _values(dt, idx, 0).reshape(shape)


def _values(dt, idx, salt):
    kind = dt.kind
    if kind == "b":
        return np.random.default_rng(20240301).random(idx.shape) < 0.5
    if kind == "u":
        if dt.itemsize == 1:
            return ((idx * 5 + 3 + salt) % 251).astype(dt)
        if dt.itemsize == 8:
            return (np.uint64(2**63) + idx.astype(np.uint64) * np.uint64(1000003)).astype(dt)
        return (idx * 3 + 1 + salt).astype(dt)
    if kind == "i":
        if dt.itemsize == 1:
            return ((idx % 200) - 100).astype(dt)
        return (idx * 3 - 50 + salt).astype(dt)
    if kind == "f":
        return (idx * 0.25 - 7.0 + salt).astype(dt)
    if kind == "c":
        return (idx * 0.5 - 1j * (idx + 1)).astype(dt)
    if kind == "S":
        words = [b"", b"a", b"bc", b"def", b"ghij", b"klmno"]
        return np.array([(words[i % len(words)] + str(i).encode())[: dt.itemsize] for i in idx],
                        dtype=dt)
    raise ValueError(dt)


def flat_path(path):
    return path.replace("/", "__")


def chunk_key_to_index(key, ndim):
    """'c1/2' -> (1, 2); zarr 2.18 spells the 0-d chunk 'c0'."""
    assert key.startswith("c"), key
    parts = key[1:].split("/")
    if ndim == 0:
        assert parts == ["0"], key
        return ()
    return tuple(int(p) for p in parts)


def data_keys(path):
    """Chunk (or shard) keys under data/root/<path>/, relative to it, sorted."""
    base = os.path.join(STORE, "data", "root", path)
    keys = []
    if not os.path.isdir(base):
        return keys
    for root, _dirs, files in os.walk(base):
        for fn in files:
            keys.append(os.path.relpath(os.path.join(root, fn), base).replace(os.sep, "/"))
    return sorted(keys, key=lambda k: (len(k.split("/")), [int(p.lstrip("c")) for p in k.split("/")]))


def read_shard(raw, cps):
    """Inner chunks of one shard: {offset tuple within shard: bytes}, and the index."""
    n = int(np.prod(cps, dtype=np.int64))
    index = np.frombuffer(raw[-16 * n:], dtype="<u8").reshape(tuple(cps) + (2,))
    inner = {}
    for local in np.ndindex(*cps):
        off, size = (int(v) for v in index[local])
        if (off, size) == (MAX_U64, MAX_U64):
            continue
        inner[local] = raw[off:off + size]
    return inner, index


def decode_chunk(meta, codecs_filters, raw):
    """Decode one chunk with numcodecs alone: compressor, then filters in reverse."""
    comp = codecs_filters["compressor"]
    buf = comp.decode(raw) if comp is not None else raw
    for f in reversed(codecs_filters["filters"]):
        buf = f.decode(buf)
    return ensure_contiguous_ndarray(buf).tobytes()


def codecs_of(meta):
    comp = None
    if "compressor" in meta:
        uri = meta["compressor"]["codec"]
        codec_id = uri.rstrip("/").split("/")[-2]
        comp = numcodecs.get_codec(dict(meta["compressor"]["configuration"], id=codec_id))
    filters = [numcodecs.get_codec(dict(f)) for f in meta["attributes"].get("filters", [])]
    return {"compressor": comp, "filters": filters}


def layout_of(meta, values, chunks_raw):
    """'C', 'F', 'C=F' (when every chunk reads the same both ways) or '-'."""
    shape = tuple(meta["shape"])
    chunks = tuple(meta["chunk_grid"]["chunk_shape"])
    if not chunks_raw:
        return "-"
    if len(shape) < 2:
        return "C=F (%d-d)" % len(shape)
    cf = codecs_of(meta)
    verdicts = []
    for cidx, raw in chunks_raw.items():
        flat = decode_chunk(meta, cf, raw)
        arr_sel = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(cidx, chunks, shape))
        loc_sel = tuple(slice(0, s.stop - s.start) for s in arr_sel)
        want = np.ascontiguousarray(values[arr_sel]).tobytes()
        match = set()
        for order in ("C", "F"):
            got = np.frombuffer(flat, dtype=values.dtype).reshape(chunks, order=order)[loc_sel]
            if np.ascontiguousarray(got).tobytes() == want:
                match.add(order)
        if not match:
            raise AssertionError("chunk %r matches neither C nor F" % (cidx,))
        verdicts.append(match)
    common = set.intersection(*verdicts)
    if not common:
        raise AssertionError("chunks disagree on the layout: %r" % verdicts)
    return "=".join(o for o in ("C", "F") if o in common)


def create_array(root, spec):
    kwargs = dict(shape=spec["shape"], chunks=spec["chunks"] or None, dtype=spec["dtype"],
                  compressor=spec["compressor"], fill_value=spec["fill_value"],
                  order=spec["order"], filters=spec.get("filters"))
    if "chunks_per_shard" in spec:
        kwargs["storage_transformers"] = [
            ShardingStorageTransformer("indexed", chunks_per_shard=spec["chunks_per_shard"])]
    if spec["path"].startswith("implicit/"):
        # zarr.create writes no group documents for the parents.
        return zarr.create(store=root.store, path=spec["path"], zarr_version=3, **kwargs)
    return root.create_dataset(spec["path"], **kwargs)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(EXPECTED)
    numcodecs.blosc.use_threads = False
    numcodecs.gzip._gzip = types.SimpleNamespace(GzipFile=_FixedMtimeGzipFile)

    store = DirectoryStoreV3(STORE)
    root = zarr.group(store=store, overwrite=True, zarr_version=3)
    for gpath, attrs in GROUPS:
        g = root if gpath == "" else root.create_group(gpath)
        if attrs:
            g.attrs.update(attrs)

    sources = {}
    for spec in ARRAYS:
        z = create_array(root, spec)
        if spec.get("attrs"):
            z.attrs.update(spec["attrs"])
        src = source_values(spec["dtype"], spec["shape"])
        sources[spec["path"]] = src
        for sel in spec["writes"]:
            if sel is None:
                z[...] = src[()] if spec["shape"] == () else src
            else:
                sl = tuple(slice(a, b) for a, b in sel)
                z[sl] = src[sl]

    # Read everything back through a fresh store, as zarr 2.18 sees it.
    numcodecs.gzip._gzip = gzip
    store = DirectoryStoreV3(STORE)
    index = {"writer": "zarr %s, numcodecs %s, numpy %s" % (
        zarr.__version__, numcodecs.__version__, np.__version__),
        "groups": {}, "implicit_groups": IMPLICIT_GROUPS, "arrays": {}}
    for gpath, _attrs in GROUPS:
        g = zarr.open_group(store=store, path=gpath or None, mode="r", zarr_version=3) \
            if gpath else zarr.open_group(store=store, mode="r", zarr_version=3)
        index["groups"][gpath] = g.attrs.asdict()

    layouts = {}
    blosc_lines = []
    for spec in ARRAYS:
        path = spec["path"]
        z = zarr.open_array(store=store, path=path, mode="r", zarr_version=3)
        got = np.asarray(z[...], dtype=z.dtype)
        with open(os.path.join(STORE, "meta", "root", path + ".array.json")) as f:
            meta = json.load(f)
        shape = tuple(meta["shape"])
        chunks = tuple(meta["chunk_grid"]["chunk_shape"])
        keys = data_keys(path)

        # The chunks actually stored, keyed by chunk index.
        chunks_raw = {}
        entry = {}
        if "chunks_per_shard" in spec:
            cps = tuple(meta["storage_transformers"][0]["configuration"]["chunks_per_shard"])
            shards = {}
            for key in keys:
                with open(os.path.join(STORE, "data", "root", path, key), "rb") as f:
                    raw = f.read()
                sidx = chunk_key_to_index(key, len(shape))
                inner, _ = read_shard(raw, cps)
                names = []
                for local, cbytes in inner.items():
                    cidx = tuple(s * c + l for s, c, l in zip(sidx, cps, local))
                    chunks_raw[cidx] = cbytes
                    names.append(_chunk_key(cidx))
                shards[key] = {"inner_chunks_written": names, "bytes": len(raw),
                               "index_bytes": 16 * int(np.prod(cps, dtype=np.int64))}
            entry["chunks_per_shard"] = list(cps)
            entry["shards"] = shards
            written = sorted(chunks_raw)
        else:
            for key in keys:
                with open(os.path.join(STORE, "data", "root", path, key), "rb") as f:
                    chunks_raw[chunk_key_to_index(key, len(shape))] = f.read()
            written = sorted(chunks_raw)

        # Defined elements and a self-check against the values meant to be written.
        src = sources[path]
        mask = np.zeros(shape, dtype=bool)
        for cidx in written:
            mask[tuple(slice(i * c, min((i + 1) * c, n))
                       for i, c, n in zip(cidx, chunks, shape))] = True
        intended = np.zeros(shape, dtype=src.dtype)
        if spec["fill_value"] is not None:
            intended[...] = np.array(spec["fill_value"], dtype=src.dtype)
            mask[...] = True
        for sel in spec["writes"]:
            if sel is None:
                intended[...] = src
            else:
                sl = tuple(slice(a, b) for a, b in sel)
                intended[sl] = src[sl]
        if spec["fill_value"] is None:
            got = got.copy()
            got[~mask] = np.zeros((), dtype=got.dtype)
        got = np.array(got, order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
        if not path.startswith("filters/scaleoffset"):  # lossy filter: checked below
            assert got.tobytes() == np.ascontiguousarray(intended).tobytes(), path

        layout = layout_of(meta, got, chunks_raw)
        layouts[path] = layout
        if meta.get("compressor", {}).get("codec", "").endswith("/blosc/1.0") and chunks_raw:
            blosc_lines.append("- `%s`: %s" % (path, blosc_summary(chunks_raw.values())))
        fname = flat_path(path) + ".npy"
        np.save(os.path.join(EXPECTED, fname), got)
        attrs = z.attrs.asdict()
        entry.update({
            "file": fname,
            "attrs": attrs,
            "user_attrs": {k: v for k, v in attrs.items() if k != "filters"},
            "shape": list(shape),
            "chunks": list(chunks),
            "dtype": z.dtype.str if z.dtype.fields is None else z.dtype.descr,
            "order": meta["chunk_memory_layout"],
            "fill_value": meta["fill_value"],
            "chunks_written": [_chunk_key(c) for c in written],
            "defined": "all" if spec["fill_value"] is not None else "written_chunks",
            "chunk_bytes_order": layout,
        })
        if spec["fill_value"] is None:
            entry["note"] = ("fill_value null: elements outside chunks_written are undefined "
                             "(zarr 2.18 returns uninitialised memory); they are 0 in the .npy")
        if path.startswith("filters/scaleoffset"):
            entry["note"] = ("FixedScaleOffset is lossy: values are round((x - 1) * 10) / 10 + 1 "
                             "as zarr 2.18 reads them, not the values written")
        index["arrays"][path] = entry

    with open(os.path.join(EXPECTED, "index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")
    write_readme(index, layouts, blosc_lines)
    print("wrote %d arrays and %d groups to %s" % (len(ARRAYS), len(GROUPS), OUT))


def _chunk_key(cidx):
    """The chunk key zarr 2.18 uses for a chunk index (0-d: 'c0')."""
    return "c" + ("/".join(str(i) for i in cidx) if cidx else "0")


def blosc_summary(chunk_bytes):
    """How many blosc chunks really went through the codec, from their headers."""
    total = compressed = 0
    flags = set()
    for raw in chunk_bytes:
        total += 1
        if not raw[2] & 0x02:
            compressed += 1
        flags.add("0x%02x" % raw[2])
    return "%d/%d chunks compressed, the rest memcpyed; header flags %s" % (
        compressed, total, ", ".join(sorted(flags)))


def all_keys():
    out = []
    for root, _dirs, files in os.walk(STORE):
        for fn in files:
            full = os.path.join(root, fn)
            out.append((os.path.relpath(full, STORE).replace(os.sep, "/"), os.path.getsize(full)))
    return sorted(out)


def write_readme(index, layouts, blosc_lines):
    lines = [README_HEAD.format(writer=index["writer"], python=sys.version.split()[0])]
    lines.append("## Arrays\n")
    lines.append("| path | dtype | shape | chunks | compressor | filters | order | fill_value "
                 "| chunks written | chunk bytes |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for spec in ARRAYS:
        path = spec["path"]
        with open(os.path.join(STORE, "meta", "root", path + ".array.json")) as f:
            meta = json.load(f)
        e = index["arrays"][path]
        comp = meta.get("compressor")
        comp_s = "-" if comp is None else "%s %s" % (
            comp["codec"].split("/codec/")[1], json.dumps(comp["configuration"], sort_keys=True))
        filt = meta["attributes"].get("filters")
        filt_s = "-" if not filt else ", ".join(f["id"] for f in filt)
        n_chunks = int(np.prod([-(-n // c) for n, c in zip(e["shape"], e["chunks"])],
                               dtype=np.int64))
        extra = ""
        if "chunks_per_shard" in e:
            extra = " (sharded %s per shard; %d shard files)" % (
                tuple(e["chunks_per_shard"]), len(e["shards"]))
        lines.append("| %s | `%s` | %s | %s | `%s` | %s | %s | `%s` | %d/%d%s | %s |" % (
            path, json.dumps(meta["data_type"]) if isinstance(meta["data_type"], str)
            else json.dumps(meta["data_type"]["type"]),
            tuple(e["shape"]), tuple(e["chunks"]), comp_s, filt_s, e["order"],
            json.dumps(e["fill_value"]), len(e["chunks_written"]), n_chunks, extra,
            layouts[path]))
    lines.append(README_QUIRKS)
    lines.append(README_BLOSC)
    lines.extend(blosc_lines)
    lines.append("")
    lines.append("## Shards\n")
    for path, e in index["arrays"].items():
        if "shards" not in e:
            continue
        lines.append("- `%s` (chunks_per_shard %s, index %d bytes at the end of each shard):" % (
            path, tuple(e["chunks_per_shard"]), 16 * int(np.prod(e["chunks_per_shard"]))))
        for skey, s in e["shards"].items():
            lines.append("  - `%s` (%d bytes): inner chunks %s" % (
                skey, s["bytes"], ", ".join("`%s`" % c for c in s["inner_chunks_written"])))
    lines.append("")
    lines.append("## Every key in store/ with its size in bytes\n")
    lines.append("```")
    for key, size in all_keys():
        lines.append("%7d  %s" % (size, key))
    lines.append("```\n")
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("\n".join(lines))


README_HEAD = """\
# Zarr v3 draft ("v3 experimental") fixtures written by zarr 2.18

Generated by `scripts/make_fixtures_v3draft.py` ({writer}, Python {python});
do not edit by hand, rerun the script.

`store/` is one zarr 2.18 `DirectoryStoreV3` hierarchy. `expected/<path with / as
__>.npy` holds what zarr 2.18 reads back for each array; `expected/index.json` has
`groups` (path -> attributes; `""` is the root), `implicit_groups` (paths with no
group document) and `arrays` (path -> `file`, `attrs` as zarr 2.18 reports them,
which include `filters`, `user_attrs` without them, shape, chunks, fill_value as
stored, `chunks_written`, `defined` and, for sharded arrays, `shards`).
Paths have no leading slash. Where `defined` is `written_chunks` (fill_value
null), compare only the chunks in `chunks_written`; the .npy holds 0 elsewhere.

"chunk bytes" is how the elements of each stored chunk lie once decoded with
numcodecs alone (compressor, then the filters in reverse), matched against the
values read back in C and in F order (`C=F` for 0-d and 1-d arrays).
"""

README_BLOSC = """
## Blosc chunks

Blosc stores buffers under 128 bytes (and data it cannot shrink) uncompressed after
its 16-byte header (flags bit 0x02, "memcpyed"); the sharded arrays count inner chunks.
"""

README_QUIRKS = """
## Layout and quirks seen in this store

- Entry point `zarr.json`: `zarr_format` and `metadata_encoding` are both the string
  `https://purl.org/zarr/spec/protocol/core/3.0`, `metadata_key_suffix` is `.json`
  at the top level, `extensions` is `[]`. (The 2022-05 core draft has
  `https://purl.org/zarr/spec/core/3.0` and `metadata_encoding` as an object
  `{"type": "json", "metadata_key_suffix": ".json"}`.)
- Metadata keys: the root group is `meta/root.group.json`, other nodes
  `meta/root/<path>.group.json` / `meta/root/<path>.array.json`; chunks are
  `data/root/<path>/c<i>/<j>/...` (the 2022-05 draft has `meta/<path>...`,
  `meta/group.json` for the root, and `data/<path>/...`: no `root` segment).
- Group documents hold only `{"attributes": {...}}`; array documents hold no
  `zarr_format` and have `attributes`, `chunk_grid` (`type` `regular`,
  `chunk_shape`, `separator` `/`), `chunk_memory_layout`, `data_type`,
  `extensions`, `fill_value`, `shape`, optional `compressor`, optional
  `storage_transformers`. No `codecs` list.
- Compressor: one object `{"codec": "https://purl.org/zarr/spec/codec/<name>/1.0",
  "configuration": {...numcodecs config without "id"...}}`, with <name> one of
  blosc, gzip, zlib, zstd, lz4, bz2, lzma. No compressor means no `compressor` key.
- Filters are not array metadata: they sit in `attributes.filters` as numcodecs
  configs (with `id`), next to the user's attributes, and zarr 2.18 reports them as
  an attribute (`z.attrs["filters"]`). They apply before the compressor on encode.
- 0-d arrays: the chunk key is `c0` (the draft says `c`), the chunk grid's
  `chunk_shape` is `[]`, and zarr 2.18 drops any requested compressor (no
  `compressor` key; the chunk is the raw 8 bytes of the value). A sharded 0-d array
  stores its shard at `c0` with `chunks_per_shard` `[1]`.
- data_type: core types as `<i4`, `>i4`, `<f8`, ... plus `bool`, `u1`, `i1` without
  a byte-order character. Others are extension objects
  `{"extension": URI, "type": ..., "fallback": null}`: complex with
  `https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/extensions/complex-dtypes/v1.0.html`,
  `S` and structured types with the placeholder strings
  `TODO: bytestring array protocol URL` / `TODO: structured array protocol URL`
  (structured `type` is the numpy descr as nested lists).
- fill_value: floats `"NaN"`, `"Infinity"`, `"-Infinity"` as strings (not bare
  tokens); complex as `[real, imag]`; `null` allowed (the 2022-05 draft forbids it);
  `S` and structured as base64 of numpy's scalar bytes. Those are padded with `=`
  (`"YWI="`, `"YWJjZA=="`) but numpy strips trailing NUL bytes of an `S` scalar, so
  the `S5` fill `b"ab"` is stored as 2 bytes (`"YWI="`), not the 5-byte itemsize
  (`"YWIAAAA="`): a reader must right-pad the decoded bytes with NULs. A structured
  fill is the full record (`"AQAAAAAAAAAAAARAb2s="`, 14 bytes).
- uint64 fill 18446744073709551615 is a plain JSON integer.
- Sharding: `"storage_transformers": [{"extension":
  "https://purl.org/zarr/spec/storage_transformers/sharding/1.0", "type":
  "indexed", "configuration": {"chunks_per_shard": [...]}}]`. `chunk_grid` keeps
  the inner chunk shape; a shard's key is the chunk key of the shard grid
  (`c<i>/<j>`). A shard is the concatenated inner chunks followed by an index of
  16 bytes per inner chunk (offset, length as little-endian uint64, C order over
  `chunks_per_shard`); a missing inner chunk is offset = length = 2^64-1. Edge
  shards keep the full index. A shard in which no inner chunk was ever written has no key.
  The inner chunks are not in grid order: each write puts the chunk just written
  first and appends the other chunks in set order.
- zarr 2.18 writes chunks equal to the fill value too (`write_empty_chunks`
  defaults to true); a chunk is absent only where nothing was written.
- Edge chunks are stored whole; the overhang holds the fill value (zeros for `null`).
- `order: F` chunks are F-ordered for every compressor, with and without filters
  (unlike zarr 1.1.0's v1 quirk); filters run on the F-ordered bytes.
- Opening an array with `storage_transformers` makes zarr 2.18 import
  `zarr.tests.test_storage_v3`, which needs pytest installed.
"""


if __name__ == "__main__":
    main()
