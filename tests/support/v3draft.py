"""Oracles of the Zarr v3 drafts: zarr 2.18 run in its own venv, and a May 2022 decoder written from the spec.

The May 2022 side uses the fixture generator's own encoder (tests/fixtures/make_fixtures_v3draft_spec.py,
numpy and numcodecs only); nothing here imports zarrfs.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import os
import subprocess
from functools import cache
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from support import FIXTURES, ZARR218_PYTHON
from support.oracles import chunk_slices

Z218 = FIXTURES / "v3draft-zarr218"
SPEC = FIXTURES / "v3draft-2022-05"
GENERATOR = FIXTURES / "make_fixtures_v3draft_spec.py"


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape, what
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if want.dtype.kind in "fc":
        np.testing.assert_array_equal(got, want, err_msg=what)  # NaN == NaN here
    else:
        assert got.tobytes() == want.tobytes(), what


def read_doc(root: str, key: str) -> dict:
    return json.loads((Path(root) / key).read_text())


def keys_below(root: str, prefix: str) -> set[str]:
    base = Path(root) / prefix
    return {str(p.relative_to(root)) for p in base.rglob("*") if p.is_file()} if base.exists() else set()


def shard_bytes(chunks: dict[int, bytes], n: int) -> bytes:
    """A shard of the drafts' sharding transformer: CHUNKS (position -> bytes) back to back, then the
    index of all N positions as little-endian (offset, nbytes) u64 pairs, 2**64-1 for an absent one."""
    index = np.full((n, 2), 2**64 - 1, dtype="<u8")
    blob = b""
    for pos, data in chunks.items():
        index[pos] = (len(blob), len(data))
        blob += data
    return blob + index.tobytes()


# --------------------------------------------------------------------------- zarr 2.18 oracle

Z218_READER = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np
import zarr
from zarr._storage.v3 import DirectoryStoreV3

store_path, request, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
store = DirectoryStoreV3(store_path)
report = {"arrays": {}, "groups": {}}
for i, path in enumerate(request.get("arrays", [])):
    try:
        a = zarr.open_array(store=store, path=path, mode="r", zarr_version=3)
        value = a[...]
    except Exception as e:
        report["arrays"][path] = {"error": f"{type(e).__name__}: {e}"}
        continue
    np.save(os.path.join(out, f"{i}.npy"), np.asarray(value), allow_pickle=False)
    report["arrays"][path] = {"file": f"{i}.npy", "attrs": a.attrs.asdict(), "dtype": a.dtype.str,
                              "shape": list(a.shape), "chunks": list(a.chunks)}
for path in request.get("groups", []):
    try:
        g = zarr.open_group(store=store, path=path or None, mode="r", zarr_version=3)
        report["groups"][path] = {"attrs": g.attrs.asdict(), "arrays": sorted(g.array_keys()),
                                  "groups": sorted(g.group_keys())}
    except Exception as e:
        report["groups"][path] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(report))
"""


def skip_or_fail(reason: str) -> None:
    """Without the oracle a developer's run skips; CI, where scripts/test.sh installs it, fails."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@cache
def zarr218_problem() -> str | None:
    """None when zarr 2.18 can be run as the oracle, else why not."""
    if not ZARR218_PYTHON.exists():
        return f"{ZARR218_PYTHON} missing (scripts/test.sh creates it)"
    r = subprocess.run(
        [str(ZARR218_PYTHON), "-c", "import zarr, pytest; print(zarr.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if r.returncode != 0 or not r.stdout.startswith("2.18"):
        return f"zarr 2.18 not importable from {ZARR218_PYTHON}: {r.stdout.strip()} {r.stderr.strip()[-300:]}"
    return None


def zarr218_run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, ZARR_V3_EXPERIMENTAL_API="1", ZARR_V3_SHARDING="1")
    r = subprocess.run([str(ZARR218_PYTHON), *args], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def zarr218_read(store_path: str, arrays=(), groups=(), workdir: Path | None = None) -> dict:
    """What zarr 2.18 reads: arrays (value, attrs, dtype) and groups (attrs, children)."""
    out = Path(workdir or store_path + ".z218")
    out.mkdir(exist_ok=True)
    request = json.dumps({"arrays": list(arrays), "groups": list(groups)})
    report = json.loads(zarr218_run(["-c", Z218_READER, store_path, request, str(out)]).stdout)
    for info in report["arrays"].values():
        if "file" in info:
            info["value"] = np.load(out / info["file"])
    return report


# --------------------------------------------------------------------------- May 2022 oracles


@cache
def generator():
    """tests/fixtures/make_fixtures_v3draft_spec.py as a module (numpy and numcodecs only, no zarrfs)."""
    spec = importlib.util.spec_from_file_location("make_fixtures_v3draft_spec", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def core_decode(blob: bytes, doc: dict, dtype: np.dtype) -> np.ndarray:
    """Decode one May 2022 chunk as "Decoding procedure" says (the codecs zarrfs writes:
    endian, then bytes codecs through numcodecs by the name in their `type` URI)."""
    chunks = tuple(doc["chunk_grid"]["chunk_shape"])
    endian = "little"
    bytes_codecs = []
    for entry in doc.get("codecs", []):
        name = entry["type"].rstrip("/").split("/")[-2]
        if name == "endian":
            endian = entry["configuration"]["endian"]
        else:
            bytes_codecs.append((name, entry.get("configuration", {})))
    data = blob
    for name, config in reversed(bytes_codecs):
        data = (
            gzip.decompress(data) if name == "gzip" else bytes(numcodecs.get_codec({"id": name, **config}).decode(data))
        )
    stored = (
        dtype.newbyteorder(">" if endian == "big" else "<") if dtype.itemsize > 1 and dtype.kind not in "V" else dtype
    )
    shape = chunks[::-1] if doc["chunk_memory_layout"] == "F" else chunks
    arr = np.frombuffer(data, dtype=stored).reshape(shape)
    return (arr.transpose() if doc["chunk_memory_layout"] == "F" else arr).astype(dtype)


def core_fill(value, dtype: np.dtype):
    """A May 2022 fill value: numbers, booleans, float tokens, `0x` bytes of `r*`, [re, im]."""
    tokens = {"NaN": np.nan, "+Infinity": np.inf, "-Infinity": -np.inf}
    if dtype.kind == "V":
        return np.frombuffer(bytes.fromhex(value[2:]), dtype)[0]
    if isinstance(value, list):
        return np.array(complex(*(tokens.get(v, v) for v in value)), dtype)
    return np.array(tokens.get(value, value) if isinstance(value, str) else value).astype(dtype)


def core_read(root: str, path: str, dtype: np.dtype) -> np.ndarray:
    """An array of a May 2022 store read by the decoder above (chunk keys by the spec's rules)."""
    doc = read_doc(root, f"meta/{path}.array.json" if path else "meta/array.json")
    shape, chunks = tuple(doc["shape"]), tuple(doc["chunk_grid"]["chunk_shape"])
    sep = doc["chunk_grid"]["separator"]
    fill = core_fill(doc["fill_value"], dtype)
    out = np.full(shape, fill, dtype=dtype)
    for idx in itertools.product(*(range(-(-s // c)) for s, c in zip(shape, chunks))):
        name = "c" + sep.join(map(str, idx)) if idx else "c"
        key = Path(root) / ("data/" + path if path else "data") / name
        if key.exists():
            chunk = core_decode(key.read_bytes(), doc, dtype)
            reg = chunk_slices(idx, chunks, shape)
            out[reg] = chunk[tuple(slice(0, r.stop - r.start) for r in reg)]
    return out
