"""Array documents as each v3 draft family writes them: zarr 2.18 under `meta/root`, the May 2022 core draft."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ... import dtypes
from ...codecs.adapters import compressor_config
from ...errors import InvalidArgument, Unsupported
from ...model import NewArray
from ..base import guess_chunks

# ---------------------------------------------------------------------------------------
# Writing: array documents as each family writes them


def dump_doc(doc: dict[str, Any]) -> bytes:
    """A metadata document as zarr 2.18 serialises it (sorted keys, 4-space indent, ASCII)."""
    return json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": ")).encode("ascii")


# zarr 2.18's data type extensions (meta.get_extended_dtype_info)
Z218_COMPLEX = (
    "https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/extensions/complex-dtypes/v1.0.html"
)
Z218_DATETIME = "https://zarr-specs.readthedocs.io/en/latest/extensions/data-types/datetime/v1.0.html"
_Z218_DATE_UNITS = {"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs", "as"}
_CORE_NAMES = {np.dtype(v): k for k, v in dtypes.V3_NAMES.items() if v is not None}


def _grid(new: NewArray) -> tuple[list[int], dict[str, Any]]:
    chunks = list(new.chunks or guess_chunks(new.shape, new.dtype.itemsize))
    if len(chunks) != len(new.shape):
        raise InvalidArgument(f"chunks {chunks} do not fit shape {list(new.shape)}")
    return chunks, {"chunk_shape": chunks, "separator": "/", "type": "regular"}


def zarr218_dtype_json(dtype: np.dtype) -> Any:
    """`data_type` as zarr 2.18 writes it (Metadata3.encode_dtype); Unsupported where it raises."""
    s = dtype.str
    if s in ("|b1", "|u1", "|i1"):
        return {"|b1": "bool", "|u1": "u1", "|i1": "i1"}[s]
    if re.fullmatch(r"[<>][uif][248]", s):
        return s
    if dtype.kind == "c" and dtype.itemsize in (8, 16):
        return {"extension": Z218_COMPLEX, "type": s, "fallback": None}
    if dtype.kind in "mM" and np.datetime_data(dtype)[0] in _Z218_DATE_UNITS and np.datetime_data(dtype)[1] == 1:
        return {"extension": Z218_DATETIME, "type": s, "fallback": None}
    if dtype.kind == "S":
        return {"extension": "TODO: bytestring array protocol URL", "type": s, "fallback": None}
    if dtype.kind == "U":
        return {"extension": "TODO: unicode array protocol URL", "type": s, "fallback": None}
    if dtype.kind == "V" and dtype.subdtype is None:
        # zarr 2.18 writes the descr list; for raw bytes (no fields) it reads `|V3` back the same
        type_ = dtypes.v2_dtype_json(dtype) if dtype.fields is not None else s
        return {"extension": "TODO: structured array protocol URL", "type": type_, "fallback": None}
    raise Unsupported(f"data type {dtype} cannot be written in zarr 2.18's v3 layout")


def protocol_array_doc(new: NewArray) -> dict[str, Any]:
    """An array document as zarr 2.18 writes under `meta/root` (its quirks included: no
    compressor for a 0-d array, chunk key `c0`; numpy type strings; `compressor` object)."""
    _, grid = _grid(new)
    doc: dict[str, Any] = {
        "attributes": {},
        "chunk_grid": grid,
        "chunk_memory_layout": "C",
        "data_type": zarr218_dtype_json(new.dtype),
        "extensions": [],
        "fill_value": dtypes.fill_to_json(new.fill, new.dtype),
        "shape": list(new.shape),
    }
    config = compressor_config(new.codec, "blosc", new.dtype.itemsize)
    if config is not None and new.shape:  # zarr 2.18 drops the compressor of 0-d arrays
        conf = {k: v for k, v in config.items() if k != "id"}
        doc["compressor"] = {"codec": f"https://purl.org/zarr/spec/codec/{config['id']}/1.0", "configuration": conf}
    return doc


def core_dtype_json(dtype: np.dtype) -> tuple[str, str | None]:
    """May 2022 `data_type` (a core name, or `r*` for raw bytes) and the endian codec's
    byte order when the elements are big-endian (None: little, the default)."""
    if dtype.kind == "V" and dtype.fields is None and dtype.subdtype is None:
        return f"r{8 * dtype.itemsize}", None
    big = dtype.str[0] == ">" and dtype.itemsize > 1
    base = dtype.newbyteorder("<") if dtype.byteorder in "<>=" else dtype
    name = _CORE_NAMES.get(base)
    if name is None:
        raise Unsupported(
            f"data type {dtype} has no core data type in the May 2022 v3 draft "
            f"(bool, intN, uintN, floatN, complexN, r*)"
        )
    return name, "big" if big else None


def core_fill_json(fill: np.ndarray, dtype: np.dtype) -> Any:
    """May 2022 `fill_value`: numbers and booleans, "NaN"/"+Infinity"/"-Infinity", `0x` bytes for `r*`."""
    value = np.asarray(fill, dtype=dtype)
    if dtype.kind == "V":
        return "0x" + value.tobytes().hex()
    if dtype.kind == "f":
        return dtypes.float_json(float(value[()]), "+Infinity")
    if dtype.kind == "c":  # the draft leaves it open; [real, imaginary] as the later spec writes it
        return [dtypes.float_json(float(v), "+Infinity") for v in (value[()].real, value[()].imag)]
    return dtypes.fill_to_json(value, dtype)


def core_array_doc(new: NewArray) -> dict[str, Any]:
    """An array document of the May 2022 core draft: `codecs` objects with `type` URIs."""
    _, grid = _grid(new)
    data_type, endian = core_dtype_json(new.dtype)
    codecs: list[dict[str, Any]] = []
    if endian is not None:
        codecs.append({"type": "https://purl.org/zarr/spec/codecs/endian/1.0", "configuration": {"endian": endian}})
    config = compressor_config(new.codec, "blosc", new.dtype.itemsize)
    if config is not None:
        conf = {k: v for k, v in config.items() if k != "id"}
        if config["id"] == "zstd":
            conf.setdefault("checksum", False)
        codecs.append({"type": f"https://purl.org/zarr/spec/codecs/{config['id']}/1.0", "configuration": conf})
    return {
        "attributes": {},
        "chunk_grid": grid,
        "chunk_memory_layout": "C",
        "codecs": codecs,
        "data_type": data_type,
        "extensions": [],
        "fill_value": core_fill_json(new.fill, new.dtype),
        "shape": list(new.shape),
    }
