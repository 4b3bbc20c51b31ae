"""Write the Zarr v1 test fixtures in tests/fixtures/v1/ with the real zarr 1.1.0.

zarr 1.1.0 (2016) is the last release that writes the version 1 storage format
(a directory per array holding `meta`, `attrs` and one file per chunk). It only
builds from its sdist, with Cython < 3 for its bundled blosc extension.

Create the venv (Python 3.11, from the repository root or anywhere):

    python3.11 -m venv /tmp/venv-zarr1
    /tmp/venv-zarr1/bin/pip install 'cython<3' 'numpy<2' setuptools wheel
    /tmp/venv-zarr1/bin/pip install --no-build-isolation --no-binary zarr zarr==1.1.0

Run it (from anywhere; paths are taken from this file's location):

    /tmp/venv-zarr1/bin/python scripts/make_fixtures_v1.py

What it writes (tests/fixtures/v1/ is deleted and recreated on every run):

    tests/fixtures/v1/<name>/              one zarr 1.1.0 DirectoryStore per array
    tests/fixtures/v1/expected/<name>.npy  np.save of what zarr 1.1.0 reads back (z[...])
    tests/fixtures/v1/expected/<name>.json which chunk keys were written, which
                                           elements are defined, and how the chunk
                                           bytes are laid out as stored
    tests/fixtures/v1/README.md            one line per fixture, and the quirks
                                           measured on the raw chunk bytes

Reproducibility: the data are fixed (arange based), so a second run writes the
same bytes. The one source of noise in the writer is `np.empty`: for an array with
`fill_value: null`, zarr 1.1.0 allocates a chunk it has never seen with
`np.empty`, so the overhang of an edge chunk (outside the array, undefined by the
spec) holds whatever memory held. While writing, this script gives zarr.core a
numpy whose `empty` is `zeros`; nothing else in the writer is touched. For the same
reason, elements outside the written chunks of a `fill_value: null` array are
undefined when zarr 1.1.0 reads them; the script writes only whole chunks of such
arrays and sets the undefined elements to zero in the saved .npy (the .json says
so with "defined": "written_chunks").
"""

import collections
import collections.abc

# zarr 1.1.0 does `from collections import MutableMapping` (removed in Python 3.10).
collections.MutableMapping = collections.abc.MutableMapping

import bz2  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import lzma  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402
import zarr  # noqa: E402
import zarr.blosc  # noqa: E402
import zarr.core  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "v1")
EXPECTED = os.path.join(OUT, "expected")

NAN = float("nan")
INF = float("inf")

# lzma filter chains; ids are the liblzma constants, stored as integers in `meta`.
LZMA_DELTA_CHAIN = [
    dict(id=lzma.FILTER_DELTA, dist=4),
    dict(id=lzma.FILTER_LZMA2, preset=1),
]
LZMA_RAW_CHAIN = [dict(id=lzma.FILTER_LZMA2, preset=1)]

STRUCT_NESTED = [("x", "<i4"), ("p", [("a", "<f4"), ("b", "|u1")]), ("s", "|S3")]
STRUCT_RGB = [("r", "|u1"), ("g", "|u1"), ("b", "|u1")]


def whole(shape):
    """A selection covering the whole array."""
    return tuple(slice(0, n) for n in shape)


# Each fixture: name, creation arguments, and the writes as a list of selections
# (tuples of (start, stop) per dimension). `attrs` is optional.
# For fill_value None the writes cover whole chunks only (edge chunks clipped).
FIXTURES = [
    # --- order C / F pairs for zlib, none and blosc -------------------------------
    dict(name="zlib_i4_C", dtype="<i4", shape=(13, 17), chunks=(5, 6),
         compression="zlib", compression_opts=1, order="C", fill_value=7,
         writes=[((0, 10), (0, 12)), ((12, 13), (16, 17)), ((3, 4), (13, 15))],
         attrs={"units": "m", "scale": 0.5, "list": [1, 2, 3]}),
    dict(name="zlib_i4_F", dtype="<i4", shape=(13, 17), chunks=(5, 6),
         compression="zlib", compression_opts=1, order="F", fill_value=7,
         writes=[((0, 10), (0, 12)), ((12, 13), (16, 17)), ((3, 4), (13, 15))]),
    dict(name="none_u2_C", dtype="<u2", shape=(9, 11), chunks=(4, 4),
         compression="none", compression_opts=None, order="C", fill_value=65535,
         writes=[((0, 9), (0, 8)), ((8, 9), (10, 11))]),
    dict(name="none_u2_F", dtype="<u2", shape=(9, 11), chunks=(4, 4),
         compression="none", compression_opts=None, order="F", fill_value=65535,
         writes=[((0, 9), (0, 8)), ((8, 9), (10, 11))]),
    dict(name="blosc_f8_C", dtype="<f8", shape=(13, 17), chunks=(5, 6),
         compression="blosc", compression_opts=dict(cname="lz4", clevel=5, shuffle=1),
         order="C", fill_value=NAN,
         writes=[((0, 10), (0, 12)), ((12, 13), (16, 17)), ((3, 4), (13, 15))],
         attrs={"missing": NAN, "note": "attrs hold a bare NaN token too"}),
    dict(name="blosc_f8_F", dtype="<f8", shape=(13, 17), chunks=(5, 6),
         compression="blosc", compression_opts=dict(cname="lz4", clevel=5, shuffle=1),
         order="F", fill_value=NAN,
         writes=[((0, 10), (0, 12)), ((12, 13), (16, 17)), ((3, 4), (13, 15))]),
    # --- bz2 and lzma ------------------------------------------------------------
    dict(name="bz2_i1_C", dtype="|i1", shape=(10, 12), chunks=(4, 5),
         compression="bz2", compression_opts=9, order="C", fill_value=-1,
         writes=[((0, 8), (0, 12))]),
    dict(name="bz2_i1_F", dtype="|i1", shape=(10, 12), chunks=(4, 5),
         compression="bz2", compression_opts=9, order="F", fill_value=-1,
         writes=[((0, 8), (0, 12))]),
    dict(name="lzma_f4_C", dtype="<f4", shape=(7, 9), chunks=(3, 4),
         compression="lzma",
         compression_opts=dict(format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6),
         order="C", fill_value=-INF,
         writes=[((0, 6), (0, 8)), ((6, 7), (8, 9))]),
    dict(name="lzma_filters_f4_F", dtype="<f4", shape=(7, 9), chunks=(3, 4),
         compression="lzma",
         compression_opts=dict(format=lzma.FORMAT_XZ, filters=LZMA_DELTA_CHAIN),
         order="F", fill_value=INF,
         writes=[((0, 6), (0, 8)), ((6, 7), (8, 9))]),
    dict(name="lzma_raw_i2_F", dtype="<i2", shape=(7, 9), chunks=(3, 4),
         compression="lzma",
         compression_opts=dict(format=lzma.FORMAT_RAW, filters=LZMA_RAW_CHAIN),
         order="F", fill_value=0,
         writes=[((0, 7), (0, 9))]),
    # --- blosc variants ------------------------------------------------------------
    dict(name="blosc_zstd_bitshuffle_i4_F", dtype="<i4", shape=(30, 25), chunks=(12, 10),
         compression="blosc", compression_opts=dict(cname="zstd", clevel=3, shuffle=2),
         order="F", fill_value=0,
         writes=[((0, 30), (0, 25))]),
    dict(name="blosc_lz4_bitshuffle_i4_F", dtype="<i4", shape=(30, 25), chunks=(12, 10),
         compression="blosc", compression_opts=dict(cname="lz4", clevel=5, shuffle=2),
         order="F", fill_value=0,
         writes=[((0, 24), (0, 25))]),
    dict(name="blosc_zlib_noshuffle_u2_C", dtype="<u2", shape=(30, 30), chunks=(12, 12),
         compression="blosc", compression_opts=dict(cname="zlib", clevel=1, shuffle=0),
         order="C", fill_value=1,
         writes=[((0, 30), (0, 18))]),
    dict(name="blosc_lz4hc_c16_F", dtype="<c16", shape=(6, 7), chunks=(4, 3),
         compression="blosc", compression_opts=dict(cname="lz4hc", clevel=9, shuffle=1),
         order="F", fill_value=None,
         writes=[((0, 4), (0, 3)), ((4, 6), (6, 7)), ((0, 4), (6, 7))]),
    dict(name="blosc_blosclz_f4_1d", dtype="<f4", shape=(250,), chunks=(64,),
         compression="blosc", compression_opts=dict(cname="blosclz", clevel=9, shuffle=1),
         order="C", fill_value=NAN,
         writes=[((0, 70),), ((200, 250),)]),
    dict(name="blosc_snappy_u2_C", dtype="<u2", shape=(40, 40), chunks=(16, 16),
         compression="blosc", compression_opts=dict(cname="snappy", clevel=5, shuffle=1),
         order="C", fill_value=0,
         writes=[((0, 40), (0, 40))]),
    dict(name="blosc_be_i4_C", dtype=">i4", shape=(200,), chunks=(64,),
         compression="blosc", compression_opts=dict(cname="lz4", clevel=5, shuffle=1),
         order="C", fill_value=0,
         writes=[((0, 130),)]),
    dict(name="blosc_i2_3d_F", dtype="<i2", shape=(10, 12, 14), chunks=(4, 6, 7),
         compression="blosc", compression_opts=dict(cname="lz4", clevel=5, shuffle=1),
         order="F", fill_value=-5,
         writes=[((0, 8), (0, 12), (0, 7)), ((9, 10), (5, 12), (10, 14))]),
    # --- more dtypes ---------------------------------------------------------------
    dict(name="zlib_f8_3d_F", dtype="<f8", shape=(5, 6, 7), chunks=(2, 3, 4),
         compression="zlib", compression_opts=6, order="F", fill_value=NAN,
         writes=[((0, 4), (0, 6), (0, 4)), ((4, 5), (3, 6), (4, 7))]),
    dict(name="zlib_be_f8_F", dtype=">f8", shape=(6, 5), chunks=(4, 3),
         compression="zlib", compression_opts=1, order="F", fill_value=-0.5,
         writes=[((0, 6), (0, 3))]),
    dict(name="zlib_b1_F", dtype="|b1", shape=(6, 10), chunks=(4, 4),
         compression="zlib", compression_opts=1, order="F", fill_value=False,
         writes=[((0, 4), (0, 8)), ((5, 6), (9, 10))]),
    dict(name="zlib_u8_C", dtype="<u8", shape=(5, 4), chunks=(2, 3),
         compression="zlib", compression_opts=1, order="C",
         fill_value=18446744073709551615,
         writes=[((0, 4), (0, 3))]),
    dict(name="none_i8_nullfill_C", dtype="<i8", shape=(10, 10), chunks=(3, 3),
         compression="none", compression_opts=None, order="C", fill_value=None,
         writes=[((0, 3), (0, 3)), ((3, 6), (6, 9)), ((9, 10), (9, 10)), ((9, 10), (0, 3))]),
    dict(name="zlib_S5_C", dtype="|S5", shape=(11,), chunks=(4,),
         compression="zlib", compression_opts=1, order="C", fill_value="ab",
         writes=[((0, 6),)]),
    dict(name="none_S4_F", dtype="|S4", shape=(5, 6), chunks=(2, 4),
         compression="none", compression_opts=None, order="F", fill_value=None,
         writes=[((0, 5), (0, 6))]),
    dict(name="blosc_struct_C", dtype=STRUCT_NESTED, shape=(60,), chunks=(16,),
         compression="blosc", compression_opts=dict(cname="lz4", clevel=5, shuffle=1),
         order="C", fill_value=None,
         writes=[((0, 16),), ((48, 60),)]),
    dict(name="zlib_struct_F", dtype=STRUCT_RGB, shape=(6, 5), chunks=(4, 3),
         compression="zlib", compression_opts=1, order="F", fill_value=None,
         writes=[((0, 6), (0, 5))]),
    # --- 0-d: zarr 1.1.0 derives the chunk key '' for it, which a DirectoryStore
    # cannot hold (writing raises IsADirectoryError), so only meta/attrs exist. ---
    dict(name="zerod_i4", dtype="<i4", shape=(), chunks=(),
         compression="zlib", compression_opts=1, order="C", fill_value=42,
         writes=[]),
]


class _ZeroingNumpy:
    """numpy as seen by zarr.core while writing: `empty` gives zeros (see docstring)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float, order="C"):
        return np.zeros(shape, dtype=dtype, order=order)


def source_values(dtype, shape):
    """Distinct, deterministic values for every element (so C and F layouts differ)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    idx = np.arange(n, dtype=np.int64)
    if dt.fields is not None:
        out = np.zeros(n, dtype=dt)
        for name in dt.names:
            out[name] = _field_values(dt[name], idx, name)
        return out.reshape(shape)
    return _field_values(dt, idx, "").reshape(shape)


def _field_values(dt, idx, salt):
    if dt.fields is not None:
        out = np.zeros(idx.shape, dtype=dt)
        for name in dt.names:
            out[name] = _field_values(dt[name], idx, salt + name)
        return out
    kind = dt.kind
    salt_offset = sum(map(ord, salt)) % 17  # struct fields get different values
    if kind == "b":
        # no period, so a chunk's C and F walks differ
        return np.random.default_rng(20160901).random(idx.shape) < 0.5
    if kind == "u":
        if dt.itemsize == 1:
            return ((idx * 5 + 3 + salt_offset) % 251).astype(dt)
        if dt.itemsize == 8:
            return (np.uint64(2**63) + idx.astype(np.uint64) * np.uint64(1000003)).astype(dt)
        return (idx * 3 + 1).astype(dt)
    if kind == "i":
        if dt.itemsize == 1:
            return ((idx % 200) - 100).astype(dt)
        return (idx * 3 - 50 + salt_offset).astype(dt)
    if kind == "f":
        return (idx * 0.25 - 7.0).astype(dt)
    if kind == "c":
        return (idx * 0.5 - 1j * (idx + 1)).astype(dt)
    if kind == "S":
        words = [b"", b"a", b"bc", b"def", b"ghij", b"klmno"]
        vals = [(words[i % len(words)] + str(i).encode())[: dt.itemsize] for i in idx]
        return np.array(vals, dtype=dt)
    raise ValueError("no source values for %r" % dt)


def chunk_keys_in(store_dir):
    return sorted(k for k in os.listdir(store_dir) if k not in ("meta", "attrs"))


def decode_raw(meta, raw, nbytes):
    """Decompress one chunk's bytes without zarr's Array (its own codecs only)."""
    comp = meta["compression"]
    opts = meta["compression_opts"]
    if comp == "none":
        return raw
    if comp == "zlib":
        return zlib.decompress(raw)
    if comp == "bz2":
        return bz2.decompress(raw)
    if comp == "lzma":
        filters = opts["filters"] if opts["format"] == lzma.FORMAT_RAW else None
        return lzma.decompress(raw, format=opts["format"], filters=filters)
    if comp == "blosc":
        dest = np.empty(nbytes, dtype="u1")
        zarr.blosc.decompress(raw, dest)
        return dest.tobytes()
    raise ValueError(comp)


def chunk_region(cidx, chunks, shape):
    """(slices into the array, slices into the chunk) for the in-array part."""
    arr = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(cidx, chunks, shape))
    loc = tuple(slice(0, s.stop - s.start) for s in arr)
    return arr, loc


def stored_layout(meta, store_dir, values, keys):
    """Which element order the stored chunk bytes follow: 'C', 'F', 'C=F' or '-'."""
    shape, chunks = tuple(meta["shape"]), tuple(meta["chunks"])
    dtype = values.dtype
    verdicts = []
    for key in keys:
        cidx = tuple(int(p) for p in key.split("."))
        with open(os.path.join(store_dir, key), "rb") as f:
            raw = f.read()
        nbytes = int(np.prod(chunks, dtype=np.int64)) * dtype.itemsize
        flat = decode_raw(meta, raw, nbytes)
        assert len(flat) == nbytes, (key, len(flat), nbytes)
        arr_sel, loc_sel = chunk_region(cidx, chunks, shape)
        want = np.ascontiguousarray(values[arr_sel]).tobytes()
        match = []
        for order in ("C", "F"):
            got = np.frombuffer(flat, dtype=dtype).reshape(chunks, order=order)[loc_sel]
            if np.ascontiguousarray(got).tobytes() == want:
                match.append(order)
        if not match:
            raise AssertionError("chunk %s matches neither C nor F layout" % key)
        # A chunk whose in-array values read the same both ways (uniform values)
        # says nothing; the layout is what every chunk agrees with.
        verdicts.append(set(match))
    if not verdicts:
        return "-"
    common = set.intersection(*verdicts)
    if not common:
        raise AssertionError("chunks disagree on the layout: %r" % verdicts)
    return "=".join(o for o in ("C", "F") if o in common)


def first_chunk_evidence(meta, store_dir, keys):
    """The first values of the first written chunk, decoded and read flat."""
    if not keys or len(meta["chunks"]) < 2:
        return None
    key = keys[0]
    with open(os.path.join(store_dir, key), "rb") as f:
        raw = f.read()
    dtype = np.dtype(_dtype_from_meta(meta["dtype"]))
    chunks = tuple(meta["chunks"])
    nbytes = int(np.prod(chunks)) * dtype.itemsize
    flat = np.frombuffer(decode_raw(meta, raw, nbytes), dtype=dtype)
    head = raw[:16].hex(" ") if meta["compression"] == "blosc" else None
    return key, flat[:6].tolist(), head


def _dtype_from_meta(d):
    if isinstance(d, list):
        return [(f, _dtype_from_meta(v)) for f, v in d]
    return d


ZSTD_MAGICS = {"fd2fb527": "zstd v0.7 frame", "fd2fb528": "zstd v0.8+/1.x frame"}
BLOSC_CODES = {0: "blosclz", 1: "lz4/lz4hc", 2: "snappy", 3: "zlib", 4: "zstd"}


def blosc_summary(store_dir, keys):
    """One line on the 16-byte blosc headers of every chunk of a store."""
    compressed = 0
    flags_seen = set()
    typesizes = set()
    for key in keys:
        with open(os.path.join(store_dir, key), "rb") as f:
            head = f.read(16)
        flags, typesize = head[2], head[3]
        nbytes, cbytes = int.from_bytes(head[4:8], "little"), int.from_bytes(head[12:16], "little")
        memcpyed = bool(flags & 0x02)
        if not memcpyed:
            compressed += 1
        flags_seen.add("0x%02x (%s%s%s%s)" % (
            flags, BLOSC_CODES.get(flags >> 5, "?"),
            ", byte shuffle" if flags & 0x01 else "",
            ", bit shuffle" if flags & 0x04 else "",
            ", memcpyed" if memcpyed else ""))
        typesizes.add(typesize)
        if flags >> 5 == 4 and not memcpyed:
            # first block: 4-byte offset table entry, then a 4-byte compressed size
            # and the zstd frame, which starts with the frame magic
            with open(os.path.join(store_dir, key), "rb") as f:
                data = f.read()
            bstart = int.from_bytes(data[16:20], "little")
            magic = data[bstart + 4:bstart + 8][::-1].hex()
            flags_seen.add("zstd frame magic 0x%s at byte %d (%s)" % (
                magic, bstart + 4, ZSTD_MAGICS.get(magic, "unknown")))
        assert cbytes == os.path.getsize(os.path.join(store_dir, key)), key
        del nbytes
    return "%d/%d chunks compressed (the rest stored memcpyed); flags %s; typesize %s" % (
        compressed, len(keys), ", ".join(sorted(flags_seen)),
        ", ".join(str(t) for t in sorted(typesizes)))


def defined_mask(shape, chunks, keys, fill_value):
    if fill_value is not None:
        return np.ones(shape, dtype=bool)
    mask = np.zeros(shape, dtype=bool)
    for key in keys:
        cidx = tuple(int(p) for p in key.split("."))
        arr_sel, _ = chunk_region(cidx, chunks, shape)
        mask[arr_sel] = True
    return mask


def fmt_fill(v):
    if v is None:
        return "null"
    return json.dumps(v)  # NaN / Infinity / -Infinity as the bare tokens in meta


def fmt_compression(meta):
    opts = meta["compression_opts"]
    if opts is None:
        return meta["compression"]
    return "%s %s" % (meta["compression"], json.dumps(opts, sort_keys=True))


def write_fixture(fx):
    name = fx["name"]
    path = os.path.join(OUT, name)
    shape = fx["shape"]
    z = zarr.open(path, mode="w", shape=shape, chunks=fx["chunks"], dtype=fx["dtype"],
                  compression=fx["compression"], compression_opts=fx["compression_opts"],
                  fill_value=fx["fill_value"], order=fx["order"])
    if fx.get("attrs"):
        z.attrs.update(fx["attrs"])
    src = source_values(fx["dtype"], shape)
    real_np = zarr.core.np
    zarr.core.np = _ZeroingNumpy()
    try:
        for sel in fx["writes"]:
            sl = tuple(slice(a, b) for a, b in sel)
            z[sl] = src[sl]
    finally:
        zarr.core.np = real_np
    return src


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(EXPECTED)
    zarr.blosc.set_nthreads(1)  # same bytes whatever the core count

    rows = []
    evidence = []
    blosc_lines = []
    for fx in FIXTURES:
        name = fx["name"]
        src = write_fixture(fx)
        store_dir = os.path.join(OUT, name)
        with open(os.path.join(store_dir, "meta"), "rb") as f:
            meta_text = f.read().decode("ascii")
        meta = json.loads(meta_text)
        keys = chunk_keys_in(store_dir)

        # What zarr 1.1.0 itself reads back.
        z = zarr.open(store_dir, mode="r")
        got = z[...]
        if not isinstance(got, np.ndarray):
            got = np.array(got, dtype=z.dtype)
        shape, chunks = tuple(meta["shape"]), tuple(meta["chunks"])
        mask = defined_mask(shape, chunks, keys, fx["fill_value"])

        # Self-check: the written values and the fill value are what we meant.
        intended = np.zeros(shape, dtype=src.dtype)
        if fx["fill_value"] is not None:
            intended.fill(fx["fill_value"])
        for sel in fx["writes"]:
            sl = tuple(slice(a, b) for a, b in sel)
            intended[sl] = src[sl]
        if fx["fill_value"] is None:
            got = got.copy()
            got[~mask] = np.zeros((), dtype=got.dtype)
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(intended).tobytes(), name

        layout = "-" if not keys else stored_layout(meta, store_dir, got, keys)
        if len(shape) < 2 and keys:
            layout = "C=F (%d-d)" % len(shape)

        # C order in the file; np.array keeps a 0-d array 0-d (ascontiguousarray would not)
        np.save(os.path.join(EXPECTED, name + ".npy"), np.array(got, order="C"))
        note = {
            "name": name,
            "writer": "zarr %s" % zarr.__version__,
            "shape": list(shape),
            "chunks": list(chunks),
            "dtype": meta["dtype"],
            "order": meta["order"],
            "compression": meta["compression"],
            "fill_value": fmt_fill(meta["fill_value"]),
            "chunks_written": keys,
            "writes": [[list(p) for p in sel] for sel in fx["writes"]],
            "defined": "all" if fx["fill_value"] is not None else "written_chunks",
            "chunk_bytes_order": layout,
        }
        if fx["fill_value"] is None:
            note["note"] = ("fill_value null: elements outside chunks_written are undefined "
                            "(zarr 1.1.0 returns uninitialised memory); they are 0 in the .npy")
        if name == "zerod_i4":
            note["note"] = ("0-d: zarr 1.1.0 uses chunk key '' which a DirectoryStore cannot "
                            "store (IsADirectoryError); the value read is the fill_value")
        with open(os.path.join(EXPECTED, name + ".json"), "w") as f:
            json.dump(note, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")

        rows.append("| %s | `%s` | %s | %s | `%s` | %s | `%s` | %d/%d | %s |" % (
            name, json.dumps(meta["dtype"]), tuple(shape), tuple(chunks),
            fmt_compression(meta), meta["order"], fmt_fill(meta["fill_value"]),
            len(keys), _n_chunks(shape, chunks), layout))
        if meta["compression"] == "blosc" and keys:
            blosc_lines.append("- `%s`: %s" % (name, blosc_summary(store_dir, keys)))
        ev = first_chunk_evidence(meta, store_dir, keys)
        if ev is not None and meta["order"] == "F":
            key, head_vals, blosc_head = ev
            line = "- `%s/%s` (order F, %s): first values of the decoded chunk, read flat: `%s`" % (
                name, key, meta["compression"], head_vals)
            sel = tuple(slice(0, min(c, n)) for c, n in zip(chunks, shape))
            block = got[sel]
            line += "; the chunk's C walk starts `%s`, its F walk `%s`" % (
                block.ravel(order="C")[:6].tolist(), block.ravel(order="F")[:6].tolist())
            if blosc_head:
                line += "; blosc header `%s`" % blosc_head
            evidence.append(line)

    write_readme(rows, evidence, blosc_lines)
    for root, _dirs, files in os.walk(OUT):
        for fn in files:  # the writer creates chunk files 0600 (tempfile); make them plain
            os.chmod(os.path.join(root, fn), 0o644)
    print("wrote %d fixtures to %s" % (len(FIXTURES), OUT))


def _n_chunks(shape, chunks):
    return int(np.prod([-(-n // c) for n, c in zip(shape, chunks)], dtype=np.int64))


def write_readme(rows, evidence, blosc_lines):
    text = README_HEAD.format(zarr=zarr.__version__, numpy=np.__version__,
                              python=sys.version.split()[0])
    text += "\n".join(rows) + "\n"
    text += README_EVIDENCE + "\n".join(evidence) + "\n"
    text += README_BLOSC + "\n".join(blosc_lines) + "\n"
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(text)


README_HEAD = """\
# Zarr v1 fixtures written by zarr {zarr}

Generated by `scripts/make_fixtures_v1.py` (zarr {zarr}, numpy {numpy}, Python {python});
do not edit by hand, rerun the script. Each directory is one zarr 1.1.0 DirectoryStore:
`meta` (JSON, with bare `NaN`/`Infinity`/`-Infinity` tokens where the fill value is
not finite), `attrs` and one file per written chunk named `i.j...`.

`expected/<name>.npy` is what zarr 1.1.0 reads back (`z[...]`);
`expected/<name>.json` lists the chunk keys written and which elements are defined.
When `fill_value` is `null`, elements outside the written chunks are undefined
(zarr 1.1.0 returns uninitialised memory there): compare only the written chunks;
the .npy holds 0 there.

"Chunk bytes" says how the elements of each written chunk lie in the decompressed
bytes as actually stored, found by decompressing every chunk file with the
compressor alone and matching it against the values read back in C and in F order
(`C=F` where both match, i.e. 1-d arrays).

Quirks confirmed here:

- zarr 1.1.0 stores the chunks of an `order: F` array in F order only with blosc.
  With zlib, bz2, lzma and none the chunk bytes are in C order: those compressors
  call `array.tobytes()` (C order whatever the memory layout) and decode with
  `np.frombuffer(...).reshape(chunk_shape)` (C order again), while blosc compresses
  the F-contiguous buffer as it lies in memory. A reader must honour `order: F` only
  for `compression: blosc`.
- `fill_value` NaN/Infinity/-Infinity appear as bare JSON tokens (`NaN`, `Infinity`,
  `-Infinity`), not strings; `attrs` may hold them too (`blosc_f8_C`).
- `fill_value` of an `S` array is a JSON string (`"ab"`), not base64.
- A structured dtype is a list of `[name, type]` pairs, nested for nested structs.
- `compression_opts` for lzma: `{{"check", "filters", "format", "preset"}}`; with
  `filters` given, `preset` is `null`; with `format` 3 (FORMAT_RAW) the decoder needs
  the filter chain. Filter ids are liblzma's integers (3 = delta, 33 = lzma2).
- `compression` `"gzip"` is accepted by the writer as an alias but stored as `"zlib"`
  (plain zlib stream, not gzip).
- A 0-d array (`zerod_i4`) gets the chunk key `''`; a DirectoryStore cannot store it
  (writing raises IsADirectoryError and leaves a `.partial` temp file), so the fixture
  has only `meta`/`attrs` and reads as its fill value.
- `blosc_snappy_u2_C` uses blosc's snappy codec, which zarr 1.1.0's bundled c-blosc
  has. numcodecs' blosc is built without snappy (0.15.2 lists blosclz, lz4, lz4hc,
  zlib, zstd): it decodes the chunks blosc stored memcpyed but fails on the
  snappy-compressed ones ("error during blosc decompression: -5"). A fixture for the
  unsupported-codec error path, whose expected values still come from zarr 1.1.0.
- zarr 1.1.0 bundles c-blosc 1.10.0.dev with zstd 0.7.4, whose frames start with
  the pre-1.0 magic 0xFD2FB527 (bytes `27 b5 2f fd`; zstd 1.x uses 0xFD2FB528).
  numcodecs' blosc (0.15.2) is built without zstd legacy support and fails on every
  compressed chunk of `blosc_zstd_bitshuffle_i4_F` ("error during blosc
  decompression: -1"); lz4, lz4hc, blosclz and zlib inside blosc decode fine, with and
  without byte or bit shuffle. Another error-path fixture; its expected values come
  from zarr 1.1.0.
- Edge chunks are stored whole (full chunk shape); the overhang outside the array is
  undefined (fill value when there is one; zeros here for `null`, see the script).

| name | dtype | shape | chunks | compression | order | fill_value | chunks written | chunk bytes |
|---|---|---|---|---|---|---|---|---|
"""

README_EVIDENCE = """
## Evidence: first decoded values of the first chunk of each `order: F` fixture

Each line decompresses the chunk file with its compressor alone and prints the first
values in storage order, next to the same chunk walked in C order and in F order.

"""

README_BLOSC = """
## Blosc headers as stored

Blosc skips compression of buffers under 128 bytes and of data it cannot shrink, and
then stores the bytes after its 16-byte header as they are (flag 0x02, "memcpyed").
Flags byte: bit 0 byte shuffle, bit 1 memcpyed, bit 2 bit shuffle, bits 5-7 codec.
The typesize is the dtype's itemsize (the whole record for a structured dtype).

"""


if __name__ == "__main__":
    main()
