"""Servers that answer a ranged read with the whole object (as `python -m http.server` does): the answer is cut to the range asked for, and each server is named once in the log.

Shared by the store over fsspec and the file systems of a reference set's targets. Pure: no trio.
"""

from __future__ import annotations

import logging
import urllib.parse

from ..repeats import LogOnce

log = logging.getLogger(__name__)


class WholeAnswers:
    """Cuts whole objects sent for a range; a WARNING names each server (scheme and host) the first
    time, as every ranged read from it then transfers the whole file."""

    def __init__(self) -> None:
        self._said = LogOnce()

    def cut(self, url: str, data: bytes, start: int, end: int) -> bytes:
        """DATA, the answer to a read of bytes [start, end) of URL, cut to them when the server sent
        more (the whole object)."""
        if len(data) <= end - start:
            return data
        parts = urllib.parse.urlsplit(url)
        server = f"{parts.scheme}://{parts.netloc}" if parts.scheme else url
        if self._said.first(server):
            log.warning(
                "%s ignores Range requests: each chunk read from it transfers its whole file (%d bytes for %d)",
                server,
                len(data),
                end - start,
            )
        return data[start:end]
