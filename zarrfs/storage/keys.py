"""Store keys: joining parts, refusing keys that would leave the store, chunk key encodings (pure)."""

from __future__ import annotations

import dataclasses
import functools
import re

from ..errors import MetadataError

# Names starting with this are the mount's own (staging areas of arrays being written):
# never a node, never accepted from users, hidden from listings.
RESERVED_PREFIX = ".zarrfs"
# Where the chunks of an array being created or replaced go until it is complete: a sibling
# prefix with no metadata document, which no reader takes for a node.
STAGING_PREFIX = RESERVED_PREFIX + "-new-"
# The one key of a staging area whose array's chunks go straight under their final keys: a JSON
# object naming their prefix and the metadata document, so that a sweep removes the chunks of
# a writer that died before that document was written.
DIRECT_MARKER = "direct.json"


def is_staging_key(key: str) -> bool:
    """Whether a key is the mount's own: in a staging area (of this daemon or of one that was
    killed) or a writer's lease beside them."""
    return any(part.startswith(RESERVED_PREFIX) for part in key.split("/"))


def check_key(key: str) -> str:
    """Refuse keys that would leave the store: absolute, `..`, empty segments, NUL, backslash."""
    if key.startswith("/") or "\0" in key or "\\" in key:
        raise MetadataError(f"refusing hostile key {key!r}")
    if key and any(part in ("", ".", "..") for part in key.split("/")):
        raise MetadataError(f"refusing hostile key {key!r}")
    return key


def join(*parts: str) -> str:
    """Join key parts with `/`, skipping empty ones."""
    return "/".join(p for p in parts if p)


@dataclasses.dataclass(frozen=True)
class ChunkKeys:
    """How a grid position becomes a store key: PREFIX + HEAD + i<SEP>j<SEP>k, or ZERO_D for 0-d.

    Checked once when made (a hostile prefix is refused here): the keys it builds from
    integers are then safe, and the store checks each key once more where it is used.
    """

    prefix: str
    sep: str = "."
    head: str = ""
    zero_d: str = "0"

    def __post_init__(self) -> None:
        if self.sep not in ("/", "."):
            raise MetadataError(f"bad chunk key separator {self.sep!r}")
        check_key(join(self.prefix, self.head + "0"))
        check_key(join(self.prefix, self.zero_d))

    def key(self, idx: tuple[int, ...]) -> str:
        name = self.head + self.sep.join(map(str, idx)) if idx else self.zero_d
        return join(self.prefix, name)

    def is_key(self, key: str) -> bool:
        """Whether `key` has the shape of a chunk key of this encoding (of any rank)."""
        if self.prefix:
            if not key.startswith(self.prefix + "/"):
                return False
            key = key[len(self.prefix) + 1 :]
        return key == self.zero_d or _chunk_name_re(self.head, self.sep).fullmatch(key) is not None


@functools.cache
def _chunk_name_re(head: str, sep: str) -> re.Pattern[str]:
    """The pattern of chunk names (below the prefix) with this head and separator."""
    return re.compile(rf"{re.escape(head)}\d+(?:{re.escape(sep)}\d+)*")
