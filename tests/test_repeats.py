"""A failing key's lines: said once, counted, said again at most once a window with the count."""

from zarrfs.repeats import OTHER_KEYS, RepeatedFailures


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
