"""Write the demo's small Zarr v2 hierarchy with numpy and numcodecs only.

Usage: python scripts/make_sample.py STORE_DIR   (replaces STORE_DIR)
Groups with attributes, arrays of several dtypes, codecs, C and F order, a missing chunk.
"""

import itertools
import json
import os
import shutil
import sys

import numcodecs
import numpy as np


def write_array(store, path, data, chunks, compressor, order="C", fill_value=0, attrs=None):
    base = os.path.join(store, path)
    os.makedirs(base, exist_ok=True)
    meta = {
        "zarr_format": 2,
        "shape": list(data.shape),
        "chunks": list(chunks),
        "dtype": data.dtype.str,
        "compressor": compressor.get_config() if compressor else None,
        "fill_value": fill_value,
        "order": order,
        "filters": None,
    }
    with open(os.path.join(base, ".zarray"), "w") as f:
        json.dump(meta, f, indent=2)
    if attrs:
        with open(os.path.join(base, ".zattrs"), "w") as f:
            json.dump(attrs, f, indent=2)
    grid = [range(-(-s // c)) for s, c in zip(data.shape, chunks)]
    for idx in itertools.product(*grid):
        block = np.full(chunks, fill_value if fill_value is not None else 0, dtype=data.dtype)
        region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, data.shape))
        part = data[region]
        if (part == fill_value).all():
            continue  # leave chunks equal to the fill value unwritten, as zarr does
        block[tuple(slice(0, n) for n in part.shape)] = part
        raw = block.tobytes(order=order)
        with open(os.path.join(base, ".".join(map(str, idx)) or "0"), "wb") as f:
            f.write(compressor.encode(raw) if compressor else raw)


def write_group(store, path, attrs):
    base = os.path.join(store, path)
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, ".zgroup"), "w") as f:
        json.dump({"zarr_format": 2}, f)
    with open(os.path.join(base, ".zattrs"), "w") as f:
        json.dump(attrs, f, indent=2)


def main(store):
    shutil.rmtree(store, ignore_errors=True)
    rng = np.random.default_rng(42)
    write_group(store, "", {"title": "zarrfs sample", "created_by": "scripts/make_sample.py"})
    write_group(store, "climate", {"units": "kelvin", "source": "synthetic"})
    y, x = np.mgrid[0:180, 0:360]
    temperature = (273.15 + 30 * np.cos(np.radians(y - 90)) + rng.normal(0, 1, y.shape)).astype("<f4")
    write_array(
        store,
        "climate/temperature",
        temperature,
        (60, 90),
        numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
        attrs={"long_name": "air temperature"},
    )
    counts = np.zeros((100, 100), dtype="<i2")
    counts[:50] = rng.integers(0, 1000, (50, 100))  # the lower half stays unwritten (fill value)
    write_array(store, "climate/counts", counts, (50, 50), numcodecs.Zstd(3))
    write_array(store, "climate/land_mask", temperature > 280, (90, 180), None)
    write_array(
        store,
        "stations/names",
        np.array([b"alpha", b"bravo", b"charlie", b"delta"], dtype="S8"),
        (2,),
        numcodecs.Zlib(1),
        fill_value="",
    )
    write_group(store, "stations", {"count": 4})
    write_array(
        store, "stations/elevation", rng.normal(500, 200, (4, 12)).astype(">f8"), (4, 5), numcodecs.GZip(5), order="F"
    )
    print(f"wrote sample hierarchy to {store}")


if __name__ == "__main__":
    main(sys.argv[1])
