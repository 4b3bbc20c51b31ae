"""Lines said once: a quirk or failure logged the first time only (LogOnce), a failing key once a window (RepeatedFailures).

Every "say it once" in zarrfs goes through these two. `LogOnce` answers whether a subject (an
array's path, a reason, a quirk of a document) is new: its line is logged then and never again
(the oldest subjects are forgotten past a bound, and may be said again). `RepeatedFailures`
is for failures that may go on: each (key, reason) is said once, then counted, and said again
at most once a window with that count. Both are thread-safe: stores and codecs call them from
worker threads, the engine from its one task.

Reasons that differ only in a byte range (`[a:b]`, `bytes a:b`) are one reason: a failing key
read a range at a time (blosc blocks, a shard's inner chunks, streamed reads) fails once per
range for one cause.

A reader that keeps failing on one key (a program retrying, the kernel asking for a page
again after a failed read-ahead, `cat` of an array whose every chunk is damaged) would
otherwise write the same line hundreds of times. As syslog daemons do, a repeat within the
window is only counted; the first failure after it is logged with that count. Nothing
here runs a timer: a key that stops failing is not mentioned again.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable, Hashable

# A repeated line is logged at most once a minute, as syslog daemons do.
REPEAT_WINDOW_S = 60.0
# Subjects or (key, reason) pairs remembered; past this the least recently seen is forgotten (its
# next line is logged again, as a first one). Bounds the memory a store of many bad keys costs.
MAX_TRACKED = 4096
# Keys named in stats.json's `errors_by_key`; failures of further keys are summed under OTHER_KEYS.
ERRORS_BY_KEY_MAX = 100
OTHER_KEYS = "(other keys)"
BYTE_RANGE = re.compile(r"\[?\b\d+:\d+\b\]?")


class LogOnce:
    """Subjects whose line was logged: `first` is true once per subject."""

    def __init__(self, max_tracked: int = MAX_TRACKED) -> None:
        self.max_tracked = max_tracked
        self._said: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def first(self, subject: Hashable) -> bool:
        """Whether SUBJECT is new (log its line now); it is remembered, so the answer is False after."""
        with self._lock:
            if subject in self._said:
                return False
            self._said[subject] = None
            if len(self._said) > self.max_tracked:
                self._said.popitem(last=False)
            return True

    def forget(self) -> None:
        """Every subject may be said again (a new epoch: a refresh, another snapshot)."""
        with self._lock:
            self._said.clear()


class RepeatedFailures:
    """Decides which failure lines reach the log, and counts failures by key."""

    def __init__(
        self,
        window_s: float = REPEAT_WINDOW_S,
        max_tracked: int = MAX_TRACKED,
        keys_max: int = ERRORS_BY_KEY_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_tracked = max_tracked
        self.keys_max = keys_max
        self.clock = clock
        # (key, reason) -> [when it was last logged, failures since then not logged]
        self._seen: collections.OrderedDict[tuple[str, str], list[float]] = collections.OrderedDict()
        self.by_key: collections.Counter[str] = collections.Counter()
        self.suppressed = 0  # failure lines not logged, in all
        self._lock = threading.Lock()

    def line(self, key: str, reason: str) -> str | None:
        """The line to log for a failure of KEY for REASON (the reason's text names the key), or
        None when the same (byte ranges apart) was logged less than a window ago (then it is counted)."""
        with self._lock:
            return self._line(key, reason)

    def _line(self, key: str, reason: str) -> str | None:
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

    def stats(self) -> dict[str, object]:
        """For stats.json: failures by key (the most frequent first) and log lines not written."""
        with self._lock:
            return {"errors_by_key": dict(self.by_key.most_common()), "log_lines_suppressed": self.suppressed}
