"""ReplyBuffer: the one buffer that fast-path reads assemble a FUSE reply in, reused by every such read."""

from __future__ import annotations

import numpy as np

# It starts at the largest read the kernel sends (1 MiB).
REPLY_BUF_MIN = 1 << 20


class ReplyBuffer:
    """Bytes reused by the reads whose reply is sent before another task runs (pyfuse3 replies
    at once): no await may lie between filling it and returning its view."""

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)
        self.view = self.buf.data  # the same bytes, flat

    def room(self, need: int) -> memoryview:
        """Make the buffer (and its flat view) hold at least NEED bytes; the view."""
        if len(self.buf) < need:
            self.buf = np.empty(max(need, REPLY_BUF_MIN), np.uint8)
            self.view = self.buf.data
        return self.view
