"""Failing keys in the log: each (key, reason) said once, then counted, and said again at most once a window.

Reasons that differ only in a byte range (`[a:b]`, `bytes a:b`) are one reason: a failing key
read a range at a time (blosc blocks, a shard's inner chunks, streamed reads) fails once per
range for one cause.

A reader that keeps failing on one key (a program retrying, the kernel asking for a page
again after a failed read-ahead, `cat` of an array whose every chunk is damaged) would
otherwise write the same line hundreds of times. As syslog daemons do, a repeat within the
window is only counted; the first failure after it is logged with that count. Nothing
here runs a timer: a key that stops failing is not mentioned again. Pure and synchronous:
the engine calls it from its one task.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable

# A repeated line is logged at most once a minute, as syslog daemons do.
REPEAT_WINDOW_S = 60.0
# (key, reason) pairs remembered; past this the least recently failed is forgotten (its next
# failure is logged again, as a first one). Bounds the memory a store of many bad keys costs.
MAX_TRACKED = 4096
# Keys named in stats.json's `errors_by_key`; failures of further keys are summed under OTHER_KEYS.
ERRORS_BY_KEY_MAX = 100
OTHER_KEYS = "(other keys)"
BYTE_RANGE = re.compile(r"\[?\b\d+:\d+\b\]?")


class RepeatedFailures:
    """Decides which failure lines reach the log, and counts failures by key."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S, max_tracked: int = MAX_TRACKED,
                 keys_max: int = ERRORS_BY_KEY_MAX, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.max_tracked = max_tracked
        self.keys_max = keys_max
        self.clock = clock
        # (key, reason) -> [when it was last logged, failures since then not logged]
        self._seen: collections.OrderedDict[tuple[str, str], list] = collections.OrderedDict()
        self.by_key: collections.Counter[str] = collections.Counter()
        self.suppressed = 0  # failure lines not logged, in all

    def line(self, key: str, reason: str) -> str | None:
        """The line to log for a failure of KEY for REASON (the reason's text names the key), or
        None when the same (byte ranges apart) was logged less than a window ago (then it is counted)."""
        self._count(key)
        now = self.clock()
        pair = (key, BYTE_RANGE.sub("[]", reason))
        seen = self._seen.get(pair)
        if seen is None:
            self._seen[pair] = [now, 0]
            if len(self._seen) > self.max_tracked:
                self._seen.popitem(last=False)
            return reason
        self._seen.move_to_end(pair)
        since, repeats = seen
        if now - since < self.window_s:
            seen[1] += 1
            self.suppressed += 1
            return None
        seen[:] = [now, 0]
        if not repeats:
            return reason
        return f"{reason} (repeated {repeats} times in the {now - since:.0f} s since it was last logged)"

    def _count(self, key: str) -> None:
        if key in self.by_key or len(self.by_key) < self.keys_max:
            self.by_key[key] += 1
        else:
            self.by_key[OTHER_KEYS] += 1

    def stats(self) -> dict:
        """For stats.json: failures by key (the most frequent first) and log lines not written."""
        return {"errors_by_key": dict(self.by_key.most_common()), "log_lines_suppressed": self.suppressed}
