"""A failing key's lines: said once, counted, said again at most once a window with the count."""

from zarrfs.repeats import OTHER_KEYS, LogOnce, RepeatedFailures


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_repeats_within_the_window_are_counted_not_said():
    clock = Clock()
    rf = RepeatedFailures(window_s=60, clock=clock)
    assert rf.line("a/0.0", "a/0.0: corrupt") == "a/0.0: corrupt"
    for _ in range(49):
        clock.now += 1
        assert rf.line("a/0.0", "a/0.0: corrupt") is None
    assert rf.line("a/0.0", "a/0.0: another reason") == "a/0.0: another reason"  # keyed by (key, reason)
    assert rf.line("b/0", "b/0: corrupt") == "b/0: corrupt"
    clock.now = 1000.0 + 61
    again = rf.line("a/0.0", "a/0.0: corrupt")
    assert again.startswith("a/0.0: corrupt (repeated 49 times in the 61 s since"), again
    assert rf.line("a/0.0", "a/0.0: corrupt") is None
    clock.now += 120
    assert rf.line("a/0.0", "a/0.0: corrupt").endswith("(repeated 1 times in the 120 s since it was last logged)")
    clock.now += 120
    assert rf.line("a/0.0", "a/0.0: corrupt") == "a/0.0: corrupt"  # nothing was held back
    assert rf.stats() == {"errors_by_key": {"a/0.0": 55, "b/0": 1}, "log_lines_suppressed": 50}


def test_memory_is_bounded():
    rf = RepeatedFailures(max_tracked=10, keys_max=5, clock=Clock())
    for i in range(100):
        assert rf.line(f"k{i}", f"k{i}: bad") == f"k{i}: bad"
    assert len(rf._seen) == 10
    assert rf.line("k0", "k0: bad") == "k0: bad"  # forgotten: said as a first failure
    assert rf.stats()["errors_by_key"] == {OTHER_KEYS: 95, "k0": 2, "k1": 1, "k2": 1, "k3": 1, "k4": 1}


def test_failures_of_one_key_that_differ_in_byte_range_are_one():
    """Ranged reads of one failing key (blosc blocks, a shard's inner chunks) fail once per
    range for one cause: said once, then counted, as a key failing whole is."""
    clock = Clock()
    rf = RepeatedFailures(window_s=60, clock=clock)
    said = [
        rf.line("a/0", f"reading 'a/0' [{i * 4096}:{(i + 1) * 4096}] failed: [Errno 5] Input/output error")
        for i in range(20)
    ]
    assert said[0] == "reading 'a/0' [0:4096] failed: [Errno 5] Input/output error"
    assert said[1:] == [None] * 19
    assert rf.line("a/0", "shard a/0: bytes 10:20 named by its index lie outside the shard") is not None
    assert rf.line("a/0", "shard a/0: bytes 30:40 named by its index lie outside the shard") is None
    assert rf.line("a/1", "reading 'a/1' [0:4096] failed: [Errno 5] Input/output error") is not None
    clock.now += 61
    again = rf.line("a/0", "reading 'a/0' [8192:12288] failed: [Errno 5] Input/output error")
    assert again.startswith("reading 'a/0' [8192:12288] failed: [Errno 5] Input/output error (repeated 19 times"), again


def test_log_once_says_each_subject_once_and_forgets_the_oldest_past_its_bound():
    said = LogOnce(max_tracked=2)
    assert said.first("a") and said.first(("zlib", "a/.zarray"))
    assert not said.first("a") and not said.first(("zlib", "a/.zarray"))
    assert said.first("b")  # "a" is forgotten: the bound holds
    assert said.first("a")
    said.forget()
    assert said.first("b")
