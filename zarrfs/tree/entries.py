"""One file or directory of the mount (Entry, its Kind), and the rules for names."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import NotFound, ZarrfsError, required
from ..model import ArrayMeta, GroupMeta, Node
from ..views import images, slices
from ..views.kinds import ARRAY_FILE_KINDS, DIR_KINDS, WRITABLE_KINDS, Kind
from ..views.registry import ARRAY_VIEWS
from ..views.streams import ArrayStream, chunk_file_size

if TYPE_CHECKING:
    from ..views.ngff import ArrayHints
    from .incoming import Incoming
    from .plain import PlainFile

__all__ = ["Entry", "Kind", "Maker", "fs_name", "name_problem", "root_array_stem", "slice_stream"]

NPY_SUFFIX = ".npy"
# Linux's NAME_MAX: the kernel refuses a whole readdir reply that holds a longer name.
NAME_MAX_BYTES = 255

Maker = Callable[[], "Entry"]


class Entry:
    """One file or directory of the mount, as long as the kernel or an open file refers to it."""

    __slots__ = (
        "inode",
        "kind",
        "view",
        "node",
        "error",
        "key",
        "origin",
        "_stream",
        "_size",
        "stored_bytes",
        "listing",
        "content",
        "lookups",
        "opens",
        "writing",
        "plain",
        "name_key",
        "checked",
        "told",
        "pages_of",
        "hints",
    )

    def __init__(
        self,
        inode: int,
        kind: Kind,
        view: str = "",
        node: Node | None = None,
        error: ZarrfsError | None = None,
        key: str | None = None,
        size: int = 0,
        origin: tuple[int, ...] | None = None,
    ) -> None:
        self.inode = inode
        self.kind = kind
        self.view = view  # the .zarrfs view directory it is in ("" for the main tree)
        self.node = node
        self.error = error
        self.key = key  # store key (store view), prefix (store dirs), path or name of a new file, slice file name
        self.origin = origin  # grid position of a chunk file
        self._stream: Any = None  # ArrayStream, or a netCDF file's layout
        self._size = size
        self.stored_bytes: int | None = None  # bytes the store holds for it, when known
        self.listing: dict[str, Maker] | None = None  # a directory's names, as last loaded
        self.content: bytes | None = None  # a generated file's bytes (info JSON)
        self.lookups = 0  # references the kernel holds (lookup, create, mkdir, readdirplus)
        self.opens = 0  # open files (handles)
        self.writing: Incoming | None = None  # an NPY file being written into an array
        self.plain: PlainFile | None = None  # a plain file (any name but NAME.npy)
        self.name_key: tuple[int, str] | None = None  # (parent inode, name) it was last given
        self.checked = -1  # the freshness epoch in which its node was last checked (freshness.py)
        self.told = -1  # the freshness epoch in which the kernel last had its checked attributes
        self.pages_of: str | None = None  # the snapshot shown at its last open (freshness.keep_pages)
        self.hints: ArrayHints | None = None  # what its NGFF image group says of an array (tiff/)

    @property
    def is_dir(self) -> bool:
        return self.kind in DIR_KINDS

    @property
    def writable(self) -> bool:
        """Data files that writes go to (the .npy tree, npy-f, raw, raw-f, chunk files, held files)."""
        return self.kind in WRITABLE_KINDS

    @property
    def saves_statistics(self) -> bool:
        """A file GDAL rewrites to save the statistics it computed (gdal/PATH.vrt,
        raw/PATH.raw.aux.xml): such a rewrite is accepted, on any mount."""
        return self.kind is Kind.PAM or (self.kind is Kind.TEXT and self.view == "gdal")

    @property
    def shown(self) -> Node:
        """The node it shows, asked only of an entry made for one (TypeError: a defect)."""
        if self.node is None:
            raise TypeError(f"inode {self.inode} ({self.kind.name}) shows no node")
        return self.node

    @property
    def array(self) -> ArrayMeta:
        """The array it shows, asked only of an array's entries (TypeError: a defect)."""
        if not isinstance(self.node, ArrayMeta):
            raise TypeError(f"inode {self.inode} ({self.kind.name}) shows no array")
        return self.node

    @property
    def incoming(self) -> Incoming:
        """`writing`, asked only of a file being written into an array (TypeError: a defect)."""
        return required(self.writing, f"inode {self.inode} ({self.kind.name}) is not being written")

    @property
    def held(self) -> PlainFile:
        """`plain`, asked only of a plain file's entry (TypeError: a defect)."""
        return required(self.plain, f"inode {self.inode} ({self.kind.name}) is no plain file")

    @property
    def group(self) -> GroupMeta:
        """The group it shows, asked only of a group's files (TypeError: a defect)."""
        if not isinstance(self.node, GroupMeta):
            raise TypeError(f"inode {self.inode} ({self.kind.name}) shows no group")
        return self.node

    @property
    def known_key(self) -> str:
        """`key`, asked only of an entry made with one (TypeError: a defect)."""
        return required(self.key, f"inode {self.inode} ({self.kind.name}) has no key")

    @property
    def position(self) -> tuple[int, ...]:
        """`origin` of a chunk file (TypeError for any other entry: a defect)."""
        return required(self.origin, f"inode {self.inode} ({self.kind.name}) is no chunk file")

    @property
    def stream(self) -> Any:
        """The byte layout of an array's file (built when first needed: a chunk directory lists
        millions of files that are never opened), or a group's netCDF file once laid out."""
        if self._stream is None and isinstance(self.node, ArrayMeta) and self.kind in ARRAY_FILE_KINDS:
            if self.kind is Kind.TIFF:
                self._stream = images.tiff_stream(self.node, hints=self.hints)
            elif self.kind is Kind.CHUNK:
                self._stream = ArrayStream(self.node, "C", True, chunk=self.origin)
            elif self.kind is Kind.SLICE:
                try:
                    self._stream = slice_stream(self.node, self.known_key)
                except slices.BadSelection as e:  # the array was replaced by one of another shape
                    self.error = NotFound(f"{self.key}: {e}")
            else:
                _, order, header = ARRAY_VIEWS[self.view]
                self._stream = ArrayStream(self.node, order, header)
        return self._stream

    @property
    def laid_out(self) -> Any:
        """Its layout if built already (None: not yet), without building it."""
        return self._stream

    def lay_out(self, stream: Any) -> None:
        """Give it a layout made elsewhere (a group's netCDF file)."""
        self._stream = stream

    def show(self, node: Node | None) -> None:
        """Show another node (a replaced or moved array); its layout is built again when needed."""
        self.node, self._stream, self.stored_bytes, self.content, self.error = node, None, None, None, None

    @property
    def size(self) -> int:
        if self.writing is not None and self.writing.size is not None:
            return self.writing.size
        if self.plain is not None:
            return self.plain.size
        if self.kind is Kind.CHUNK and self._stream is None and isinstance(self.node, ArrayMeta):
            return chunk_file_size(self.node, self.position)
        stream = self.stream
        return stream.size if stream is not None else self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = value


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a directory entry (None when it can)."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name or "\0" in name:
        return "a file name cannot hold / or NUL"
    try:
        n = len(os.fsencode(name))
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape
        return "a file name must be valid text"
    if n > NAME_MAX_BYTES:
        return f"a name of {n} bytes is longer than a file name can be ({NAME_MAX_BYTES})"
    return None


def slice_stream(meta: ArrayMeta, name: str) -> slices.SliceStream:
    """The layout of `slice/BASE[SEL].npy` (or `.raw`) of an array (BadSelection says why not)."""
    parts = slices.split_name(name)
    if parts is None:
        raise slices.BadSelection(f"{name!r} names no slice")
    _, text, header = parts
    dims, scalar = slices.selection(text, meta.shape)
    return slices.SliceStream(meta, dims, header, scalar)


def root_array_stem(source: str) -> str:
    """The name of a root array: SOURCE's last component without `.zarr`, else `array`."""
    last = re.split(r"[/\\]|::|://", source.rstrip("/"))[-1]
    stem = last[: -len(".zarr")] if last.endswith(".zarr") else last
    return stem or "array"


def fs_name(name: bytes) -> str:
    """A name the kernel gave, as text (undecodable bytes as surrogates)."""
    return os.fsdecode(name)
