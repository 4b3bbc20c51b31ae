"""Data types and fill values of every format, to and from numpy."""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

import numpy as np

from .errors import MetadataError, Unsupported

# Core v3 data type names (final spec and the drafts) and their numpy equivalents.
V3_NAMES = {
    "bool": "|b1",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "|u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
    "bfloat16": None,  # named by the spec, but numpy has no such type
}
# Names of variable-size types (v3 final and zarr-python 3 extensions).
VARIABLE_SIZE_V3 = {"string", "bytes", "variable_length_bytes", "vlen-utf8", "vlen-bytes", "object"}


def _tuplify(descr: Any) -> Any:
    """JSON lists of a structured v2 descr become the tuples numpy expects."""
    if isinstance(descr, list):
        out = []
        for field in descr:
            if not isinstance(field, list) or len(field) not in (2, 3):
                raise MetadataError(f"bad structured dtype field {field!r}")
            name, sub = field[0], _tuplify(field[1])
            out.append((name, sub, tuple(field[2])) if len(field) == 3 else (name, sub))
        return out
    return descr


def check_fixed_size(dtype: np.dtype) -> np.dtype:
    """Refuse data types that have no fixed size, with the reason."""
    if dtype.hasobject or dtype.kind == "O":
        raise Unsupported(f"data type {dtype} has variable-size elements, not readable yet")
    if dtype.itemsize == 0 and dtype.kind in "SUV":
        raise Unsupported(f"data type {dtype} has no fixed size")
    return dtype


def v2_dtype(descr: Any) -> np.dtype:
    """The numpy dtype of a v2 (and v1) `dtype` field: a typestr or a structured list."""
    if isinstance(descr, str) and descr.lstrip("<>|=").startswith("O"):
        raise Unsupported(f"data type {descr!r} holds objects (variable-size), not readable yet")
    try:
        dtype = np.dtype(_tuplify(descr))
    except (TypeError, ValueError) as e:
        raise MetadataError(f"unknown data type {descr!r}: {e}") from None
    return check_fixed_size(dtype)


def v3_dtype(spec: Any) -> np.dtype:
    """The numpy dtype of a v3 `data_type` (final spec, zarr-python 3 names, and the drafts)."""
    if isinstance(spec, dict):
        name, config = spec.get("name"), spec.get("configuration") or {}
    else:
        name, config = spec, {}
    if not isinstance(name, str):
        raise MetadataError(f"bad data_type {spec!r}")
    if name in VARIABLE_SIZE_V3:
        raise Unsupported(f"data type {name!r} has variable-size elements, not readable yet")
    if name in V3_NAMES:
        if V3_NAMES[name] is None:
            raise Unsupported(f"data type {name!r} has no numpy equivalent")
        return np.dtype(V3_NAMES[name])
    if name.startswith("r") and name[1:].isdigit():
        bits = int(name[1:])
        if bits <= 0 or bits % 8:
            raise MetadataError(f"raw data type {name!r} must be a positive multiple of 8 bits")
        return np.dtype(f"V{bits // 8}")
    try:
        if name in ("null_terminated_bytes", "fixed_length_bytes"):
            return np.dtype(f"S{int(config['length_bytes'])}")
        if name == "raw_bytes":
            return np.dtype(f"V{int(config['length_bytes'])}")
        if name == "fixed_length_utf32":
            return np.dtype(f"<U{int(config['length_bytes']) // 4}")
        if name in ("numpy.datetime64", "numpy.timedelta64"):
            scale = int(config.get("scale_factor", 1))
            unit = f"{scale}{config['unit']}" if scale != 1 else config["unit"]
            return np.dtype(f"<{'M' if 'datetime' in name else 'm'}8[{unit}]")
        if name == "structured":
            fields = [(f[0], v3_dtype(f[1])) for f in config["fields"]]
            return check_fixed_size(np.dtype(fields))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise MetadataError(f"bad configuration for data type {name!r}: {e!r}") from None
    raise Unsupported(f"unknown data type {name!r}")


def _float_token(value: Any, dtype: np.dtype) -> Any:
    """A float fill value: a number (or boolean), NaN/Infinity tokens, `0x` hex bit patterns,
    or a number written as text (zarr-python 2 and 3 both read "1.5")."""
    if isinstance(value, (int, float)):
        return float(value) if isinstance(value, bool) else value
    if isinstance(value, str):
        v = value.strip()
        if v in ("NaN", "nan"):
            return math.nan
        if v in ("Infinity", "+Infinity", "inf"):
            return math.inf
        if v in ("-Infinity", "-inf"):
            return -math.inf
        if v[:2] in ("0x", "0b"):
            bits = int(v, 16 if v[:2] == "0x" else 2)
            return np.array(bits, dtype=f"<u{dtype.itemsize}").view(dtype.newbyteorder("<"))[()]
        try:
            return float(v)
        except ValueError:
            pass
    raise MetadataError(f"bad fill value {value!r} for {dtype}")


def _base64(value: str, padded: bool) -> bytes:
    """Bytes of base64 text as zarr-python decodes it (characters outside the alphabet are
    skipped); unless `padded`, missing `=` padding is tolerated (a writer of the drafts left it out)."""
    if not padded:
        value += "=" * (-len(_NOT_BASE64.sub("", value)) % 4)
    return base64.b64decode(value)  # binascii.Error when it is not base64


_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/]")


def bytes_value(value: Any) -> bytes:
    """Bytes of a fill value given as base64 text (padded or not) or a list of byte values."""
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)
    if isinstance(value, str):
        try:
            return _base64(value, padded=False)
        except (binascii.Error, ValueError):
            raise MetadataError(f"fill value {value!r} is not base64") from None
    raise MetadataError(f"bad fill value {value!r} for a bytes type")


def _legacy_bytes(value: Any, dtype: np.dtype) -> bytes:
    """An `S` fill value as zarr-python 2 reads v2 documents: base64 text, else the text itself
    (old releases wrote plain text, and numbers: `0` reads as b"0"), a number in its decimal form."""
    if isinstance(value, str):
        try:
            return _base64(value, padded=True)
        except (binascii.Error, ValueError):
            return value.encode("ascii")
    if isinstance(value, (bool, int, float)):
        return bytes(np.array(value, dtype=dtype)[()])
    return bytes_value(value)


def _bool_value(value: Any) -> bool:
    """A boolean fill value: JSON `true`/`false`, or anything else as zarr-python 2 and 3 read it
    (a number: not zero; a string: not empty, so "false" is True)."""
    if isinstance(value, (bool, int, float, str)):
        return bool(value)
    raise MetadataError(f"bad fill value {value!r} for bool")


def _integer_value(value: Any, dtype: np.dtype, legacy: bool = False) -> int:
    """An integer fill value: a JSON number with no fraction, a boolean, or a number as text, within
    range. `legacy` (zarr-python 2 over numpy 1): a fraction is cut off, out of range wraps around."""
    if isinstance(value, bool):
        value = int(value)
    elif isinstance(value, float):
        if not value.is_integer() and not (legacy and math.isfinite(value)):
            raise MetadataError(f"bad fill value {value!r} for {dtype}: not an integer")
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value, 10 if value.strip().lstrip("+-").isdigit() else 0)
        except ValueError:
            raise MetadataError(f"bad fill value {value!r} for {dtype}: not an integer") from None
    if not isinstance(value, int):
        raise MetadataError(f"bad fill value {value!r} for {dtype}: not an integer")
    info = np.iinfo(dtype)
    if legacy and not info.min <= value <= info.max and -(2**63) <= value < 2**64:
        value = np.array(value % 2**info.bits, dtype=f"u{dtype.itemsize}").view(dtype.newbyteorder("="))[()]
        return int(value)
    if not info.min <= value <= info.max:
        raise MetadataError(f"fill value {value} is out of the range of {dtype} ({info.min}..{info.max})")
    return value


def _time_value(value: Any, dtype: np.dtype, legacy: bool = False) -> np.ndarray:
    """A datetime64/timedelta64 fill value: the int64 count of units, or "NaT"; `legacy`: also
    text numpy parses (zarr-python 2: "" is NaT, "2020-01-01" a date)."""
    if isinstance(value, str) and value == "NaT":
        return np.array("NaT", dtype=dtype)
    if legacy and isinstance(value, str):
        try:
            return np.array(value, dtype=dtype)
        except ValueError:
            raise MetadataError(f"bad fill value {value!r} for {dtype}") from None
    count = _integer_value(value, np.dtype("<i8"))
    return np.array(count, dtype="<i8").view(dtype.newbyteorder("<")).astype(dtype)


def fill_value(value: Any, dtype: np.dtype, bytes_as_text: bool = False, legacy: bool = False) -> np.ndarray:
    """The fill value from JSON as a 0-d array of `dtype`; null means zeros.

    Values are read as zarr-python reads them: `legacy` as zarr-python 2 reads v1 and v2
    documents (numpy's conversions), else as zarr-python 3 reads v3 ones; both accept more
    than their specs (booleans for numbers, numbers as text, any string for a bool).
    Fixed-size bytes (`S`) are base64 in v2 and v3; v1 writers stored them as plain text.
    What cannot be read so is a MetadataError (the format module decides what it costs).
    """
    out = np.zeros((), dtype=dtype)
    if value is None:
        return out
    kind = dtype.kind
    if isinstance(value, list) and kind not in "cV" and (legacy or kind != "S"):
        # zarr-python broadcasts a list along the chunk's last axis: one element is a fill value,
        # more are not (a v3 `S` list is its bytes, below)
        if len(value) != 1:
            raise MetadataError(f"bad fill value {value!r} for {dtype}: a list, not one value")
        value = value[0]
    try:
        if dtype.fields is not None or kind == "V":
            raw = bytes_value(value)
            out = np.frombuffer(raw.ljust(dtype.itemsize, b"\0")[: dtype.itemsize], dtype=dtype)[0]
            return np.array(out, dtype=dtype)
        if kind == "S":
            if bytes_as_text and isinstance(value, str):
                raw = value.encode("latin1")
            else:
                raw = _legacy_bytes(value, dtype) if legacy else bytes_value(value)
            out[()] = raw[: dtype.itemsize]
        elif kind == "U":
            if not isinstance(value, (str, bool, int, float)):
                raise MetadataError(f"bad fill value {value!r} for {dtype}")
            out[()] = value
        elif kind == "b":
            out[()] = _bool_value(value)
        elif kind in "iu":
            out[()] = _integer_value(value, dtype, legacy)
        elif kind == "f":
            out[()] = _float_token(value, dtype)
        elif kind == "c":
            if isinstance(value, (list, tuple)) and len(value) == 2:
                part = np.dtype(f"{dtype.byteorder if dtype.byteorder in '<>' else '<'}f{dtype.itemsize // 2}")
                out[()] = complex(_float_token(value[0], part), _float_token(value[1], part))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[()] = value
            else:
                raise MetadataError(f"bad complex fill value {value!r}")
        elif kind in "mM":
            out[()] = _time_value(value, dtype, legacy)
        else:
            raise Unsupported(f"fill value for data type {dtype}")
    except (TypeError, ValueError, OverflowError, UnicodeError) as e:
        raise MetadataError(f"bad fill value {value!r} for {dtype}: {e}") from None
    return out


# --- the other way: numpy to each format's JSON (for arrays created through the mount) ---

_V3_BY_NUMPY = {np.dtype(v).newbyteorder("<"): k for k, v in V3_NAMES.items() if v is not None}


def v2_dtype_json(dtype: np.dtype) -> Any:
    """A v1/v2 `dtype` field: the typestr, or the descr list of a structured type."""
    descr = np.lib.format.dtype_to_descr(dtype)
    return [list(f) for f in descr] if isinstance(descr, list) else descr


def v3_dtype_json(dtype: np.dtype) -> tuple[Any, str]:
    """A final-v3 `data_type` and the `bytes` codec endianness that keeps the bytes as they are."""
    endian = "big" if dtype.byteorder == ">" else "little"
    base = dtype.newbyteorder("<") if dtype.byteorder in "<>=" else dtype
    if base in _V3_BY_NUMPY:
        return _V3_BY_NUMPY[base], endian
    if dtype.fields is not None and dtype.names is not None:
        fields = [[name, v3_dtype_json(dtype.fields[name][0])[0]] for name in dtype.names]
        return {"name": "structured", "configuration": {"fields": fields}}, endian
    if dtype.kind == "S":
        return {"name": "null_terminated_bytes", "configuration": {"length_bytes": dtype.itemsize}}, endian
    if dtype.kind == "V":
        return {"name": "raw_bytes", "configuration": {"length_bytes": dtype.itemsize}}, endian
    if dtype.kind == "U":
        return {"name": "fixed_length_utf32", "configuration": {"length_bytes": dtype.itemsize}}, endian
    if dtype.kind in "mM":
        unit, count = np.datetime_data(dtype)
        name = "numpy.datetime64" if dtype.kind == "M" else "numpy.timedelta64"
        return {"name": name, "configuration": {"unit": unit, "scale_factor": count}}, endian
    raise Unsupported(f"data type {dtype} has no v3 equivalent")


def float_json(value: float, plus_infinity: str = "Infinity") -> Any:
    """A float as JSON: NaN and the infinities as strings (the May 2022 draft spells `+Infinity`)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return plus_infinity if value > 0 else "-Infinity"
    return float(value)


def fill_to_json(fill: np.ndarray, dtype: np.dtype, bytes_as_text: bool = False) -> Any:
    """The JSON of a fill value (0-d array of `dtype`), as v2 and v3 write it."""
    value = np.asarray(fill, dtype=dtype)[()]
    kind = dtype.kind
    if dtype.fields is not None or kind == "V":
        return base64.b64encode(np.asarray(fill, dtype=dtype).tobytes()).decode()
    if kind == "S":
        return bytes(value).decode("latin1") if bytes_as_text else base64.b64encode(bytes(value)).decode()
    if kind == "U":
        return str(value)
    if kind == "b":
        return bool(value)
    if kind in "iu":
        return int(value)
    if kind == "f":
        return float_json(float(value))
    if kind == "c":
        return [float_json(float(value.real)), float_json(float(value.imag))]
    if kind in "mM":
        return int(np.asarray(fill, dtype=dtype).view("<i8" if dtype.byteorder != ">" else ">i8"))
    raise Unsupported(f"fill value for data type {dtype}")
