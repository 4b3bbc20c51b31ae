"""An NPY file being written into an array: its bytes until the header is whole, then which data bytes arrived.

The state every open of one arriving file shares (Entry.writing); ingest.py takes it through
its steps (staged, committed, dropped).
"""

from __future__ import annotations

import bisect

import numpy as np

from .. import npy
from ..dtypes import check_fixed_size
from ..errors import InvalidArgument, Unsupported, ZarrfsError, required
from ..formats.base import StagedArray
from ..model import Node
from ..views.streams import ArrayStream


class Coverage:
    """Which bytes of a range arrived: sorted, disjoint, merged [start, end) spans."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        i = bisect.bisect_left(self._spans, (start, start))
        if i and self._spans[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(self._spans) and self._spans[j][0] <= end:
            start, end = min(start, self._spans[j][0]), max(end, self._spans[j][1])
            j += 1
        self._spans[i:j] = [(start, end)]

    @property
    def covered(self) -> int:
        return sum(end - start for start, end in self._spans)


class Incoming:
    """An NPY file being written into an array: its bytes until the header is whole (`pending`),
    then the staged array it fills (`staged`), the writer's own layout (`stream`: its order and
    header), the data bytes that arrived (`received`), or why it will not be an array (`rejected`).
    After the commit only `stream` is left, for the writer's own reads until its last close."""

    def __init__(self, replacing: Node | None) -> None:
        self.pending: bytearray | None = bytearray()
        self.replacing = replacing  # the array it replaces
        self.staged: StagedArray | None = None
        self.stream: ArrayStream | None = None
        self.received: Coverage | None = None
        self.rejected: ZarrfsError | None = None
        self.mtime_ns: int | None = None  # set by the writer before the commit (cp -p)

    @property
    def header_bytes(self) -> bytearray:
        """`pending`, asked only before the header is whole (TypeError: a defect)."""
        return required(self.pending, "the NPY header was whole already")

    @property
    def array(self) -> StagedArray:
        """`staged`, asked only of a staged file (TypeError: a defect)."""
        return required(self.staged, "no staged array")

    @property
    def layout(self) -> ArrayStream:
        """`stream`, asked only once the header is whole (TypeError: a defect)."""
        return required(self.stream, "no NPY header yet")

    @property
    def size(self) -> int | None:
        if self.stream is not None:
            return self.stream.size
        return len(self.pending) if self.pending is not None else None

    def reject(self, error: ZarrfsError) -> ZarrfsError:
        """It will not become an array: later writes fail too, the last close drops it."""
        self.pending = bytearray()
        self.rejected = error
        return error

    def header_problem(self, name: str) -> InvalidArgument | None:
        """Why a file given some bytes but no whole NPY header cannot be an array (None: it is fine)."""
        if self.pending is None or self.rejected is not None or not self.pending:
            return None
        return InvalidArgument(f"{name}: {npy.incomplete_reason(self.pending)}")

    def missing(self) -> tuple[int, int]:
        """(data bytes received, data bytes its header declares) of a staged file."""
        assert self.received is not None and self.stream is not None  # (staged)
        return self.received.covered, self.stream.size - len(self.stream.header)

    @property
    def complete(self) -> bool:
        """Every data byte its header declares arrived (a staged file)."""
        got, want = self.missing()
        return got == want


def parse_npy_header(head: bytes | bytearray, label: str) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """(shape, fortran, dtype, header length) of a whole NPY header, None when incomplete;
    InvalidArgument when it is no NPY header or holds a data type without a fixed size."""
    try:
        parsed = npy.parse_header(head)
        if parsed is not None:
            check_fixed_size(parsed[2])
    except (npy.NotNpy, Unsupported) as e:
        raise InvalidArgument(f"{label}: {e}") from None
    return parsed
