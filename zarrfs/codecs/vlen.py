"""The vlen-utf8 and vlen-bytes codecs as an array->bytes step that decodes to fixed-width `U`/`S`.

An array of such a codec is shown with the width of its longest element, found when its
metadata is read (formats/vlen.py). Encoding is refused: the width of a file cannot follow
what is written into it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numcodecs
import numpy as np

from ..errors import CorruptChunk, Unsupported
from .chain import MemoryOrder

# The numcodecs id of each vlen codec and the numpy kind it is shown as.
VLEN_KINDS = {"vlen-utf8": "U", "vlen-bytes": "S"}
READ_ONLY_REASON = "variable-length {what} are shown as fixed-width {kind} and cannot be written through the mount"


@dataclasses.dataclass(frozen=True)
class VLenArrayBytes:
    """numcodecs vlen-utf8 / vlen-bytes as the array->bytes step, decoded to fixed-width U / S.

    `order` is the element order of a v2 chunk (`order: F` lays out the objects in F order).
    """

    name: str
    order: MemoryOrder = "C"

    @property
    def kind(self) -> str:
        return VLEN_KINDS[self.name]

    def items(self, data: Any, count: int) -> np.ndarray:
        """The chunk's elements as a flat object array (str or bytes)."""
        out = numcodecs.get_codec({"id": self.name}).decode(data)
        if out.size != count:
            raise CorruptChunk(f"{self.name} chunk holds {out.size} items, expected {count}")
        return out

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray | None) -> np.ndarray:
        items = self.items(data, math.prod(shape))
        fixed = fixed_width(items, self.kind)
        if fixed.dtype.itemsize > dtype.itemsize:
            raise CorruptChunk(
                f"an element is longer than the width {dtype} found when the array was "
                f"first read (the store changed since; refresh)"
            )
        return fixed.astype(dtype).reshape(shape, order=self.order)

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """numcodecs' layout: a 4-byte count, then per element a 4-byte length and at most
        the element's width in bytes (`U` widths are 4 bytes a character, UTF-8 at most 4)."""
        return 4 + math.prod(shape) * (4 + dtype.itemsize)

    def encode(self, arr: np.ndarray, fill: np.ndarray) -> Any:
        raise Unsupported(READ_ONLY_REASON.format(what="strings" if self.kind == "U" else "bytes", kind=self.kind))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": {}}


def fixed_width(items: np.ndarray, kind: str) -> np.ndarray:
    """Object elements (str or bytes) as a numpy U or S array just wide enough for the longest."""
    if not items.size:
        return np.zeros(items.shape, f"{kind}1")
    try:
        return items.astype(str if kind == "U" else bytes)
    except (TypeError, ValueError, UnicodeError) as e:
        raise CorruptChunk(f"elements are not {'strings' if kind == 'U' else 'bytes'}: {e}") from None


def vlen_step(name: Any, order: MemoryOrder, where: str) -> VLenArrayBytes:
    """The array->bytes step of a vlen codec name, or Unsupported for other object codecs."""
    if name not in VLEN_KINDS:
        raise Unsupported(f"{where}: object codec {name!r} is not supported (only vlen-utf8, vlen-bytes)")
    return VLenArrayBytes(name, order)
