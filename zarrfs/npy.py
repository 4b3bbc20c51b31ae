"""NPY file headers (format 1.0, else 2.0, else 3.0), byte-identical to what numpy.save writes."""

from __future__ import annotations

import io
import struct

import numpy as np

MAGIC = b"\x93NUMPY"
# numpy aligns the data start to 64 bytes and leaves room after the header dict for the
# first (C) or last (F) axis to grow to 21 digits; we reproduce both to match np.save.
ARRAY_ALIGN = 64
GROWTH_AXIS_MAX_DIGITS = 21


def header(dtype: np.dtype, shape: tuple[int, ...], fortran_order: bool = False) -> bytes:
    """The complete NPY header (magic, length, dict, padding, newline) for an array."""
    shape = tuple(int(n) for n in shape)
    descr = np.lib.format.dtype_to_descr(dtype)
    text = f"{{'descr': {descr!r}, 'fortran_order': {bool(fortran_order)!r}, 'shape': {shape!r}, }}"
    if shape:
        grow_axis = shape[-1] if fortran_order else shape[0]
        text += " " * (GROWTH_AXIS_MAX_DIGITS - len(repr(grow_axis)))
    for version, fmt, encoding in (((1, 0), "<H", "latin1"), ((2, 0), "<I", "latin1"), ((3, 0), "<I", "utf8")):
        try:
            body = text.encode(encoding)
        except UnicodeEncodeError:
            continue
        hlen = len(body) + 1
        pad = ARRAY_ALIGN - ((len(MAGIC) + 2 + struct.calcsize(fmt) + hlen) % ARRAY_ALIGN)
        try:
            prefix = MAGIC + bytes(version) + struct.pack(fmt, hlen + pad)
        except struct.error:
            continue
        return prefix + body + b" " * pad + b"\n"
    raise ValueError("NPY header too large")


# The largest NPY header accepted: numpy's own reader stops at 10,000 bytes, but `header`
# writes whatever a dtype needs (a 3,000-field record takes 57 KB) and the mount serves
# it, so it must take it back. 1 MiB holds tens of thousands of fields and still bounds
# what a writer can make us buffer and parse before its data.
MAX_HEADER_BYTES = 1 << 20


class NotNpy(ValueError):
    """Bytes that do not start with a valid NPY header."""


def parse_header(data: bytes | bytearray) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """(shape, fortran_order, dtype, header length) of the NPY header at the start of `data`.

    None while `data` is too short to hold the whole header; NotNpy when it is no NPY file
    or its header length field claims more than MAX_HEADER_BYTES.
    """
    if len(data) < len(MAGIC):
        if not MAGIC.startswith(bytes(data)):
            raise NotNpy("not an NPY file (bad magic)")
        return None
    if not bytes(data[: len(MAGIC)]) == MAGIC:
        raise NotNpy("not an NPY file (bad magic)")
    if len(data) < len(MAGIC) + 2:
        return None
    major = data[len(MAGIC)]
    if major not in (1, 2, 3):
        raise NotNpy(f"unknown NPY format version {major}")
    len_size = 2 if major == 1 else 4
    start = len(MAGIC) + 2 + len_size
    if len(data) < start:
        return None
    hlen = int.from_bytes(data[len(MAGIC) + 2 : start], "little")
    if start + hlen > MAX_HEADER_BYTES:
        raise NotNpy(f"header length field claims {hlen} bytes, more than the {MAX_HEADER_BYTES} accepted")
    if len(data) < start + hlen:
        return None
    buf = io.BytesIO(bytes(data[: start + hlen]))
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(buf, max_header_size=MAX_HEADER_BYTES)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(buf, max_header_size=MAX_HEADER_BYTES)
    except (ValueError, SyntaxError, TypeError) as e:
        raise NotNpy(f"bad NPY header: {e}") from None
    return tuple(int(n) for n in shape), bool(fortran), dtype, start + hlen


def incomplete_reason(data: bytes | bytearray) -> str:
    """Why bytes that stop short of a whole NPY header are not one (for the log and the caller)."""
    if len(data) >= len(MAGIC) + 4:
        len_size = 2 if data[len(MAGIC)] == 1 else 4
        start = len(MAGIC) + 2 + len_size
        if len(data) >= start:
            hlen = int.from_bytes(data[len(MAGIC) + 2 : start], "little")
            return f"NPY header incomplete after {len(data)} bytes (its length field claims {hlen} bytes)"
    return f"NPY header incomplete after {len(data)} bytes"
