"""The repository names no file or path outside itself: no build machine's paths, no home
directories, no notes kept beside the repository (every tracked file, as `git ls-files` lists it)."""

from __future__ import annotations

import re
import subprocess

import pytest

from support import REPO

# A path starts a token: `meta/root/` (a v3 draft's key) and `/usr/share/` are not outside paths.
_START = r"(?<![\w./-])"
OUTSIDE = re.compile(
    rf"{_START}/work/|{_START}/root/|{_START}/home/\w|{_START}/Users/\w|{_START}shared/"
    r"|\bFACTS\.md|\bDESIGN\.md|\bSTYLE\.md"
)
THIS_FILE = "tests/unit/test_repository.py"  # its own patterns are the only allowed mention


def outside_paths(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line of TEXT that names a path outside the repository."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def tracked_files() -> list[str]:
    try:
        r = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        pytest.fail("git is not installed: the repository check lists the tracked files with it", pytrace=False)
    if r.returncode != 0:
        pytest.fail(f"git ls-files failed in {REPO}: {r.stderr.decode(errors='replace').strip()}", pytrace=False)
    return [name for name in r.stdout.decode().split("\0") if name]


@pytest.mark.parametrize(
    "line",
    [
        "see /work/shared/FACTS.md for the figures",
        "measured on the build machine (/root/zarrfs/.venv)",
        "cp /home/alice/data.zarr .",
        "open('/Users/bob/x')",
        "the user contract (DESIGN.md)",
        "as STYLE.md asks",
        "`shared/notes.txt`",
    ],
)
def test_outside_paths_are_found(line):
    assert outside_paths(f"first line\n{line}\n") == [(2, line)]


@pytest.mark.parametrize(
    "line",
    [
        "meta/root/g/notes.txt and data/root/P/c0/0 (the drafts' keys)",
        "`~/.cache/zarrfs` for other users",
        "/usr/share/doc and /var/cache/zarrfs",
        "/usr/lib/shared/libx.so",
    ],
)
def test_paths_of_the_product_are_not_outside_paths(line):
    assert outside_paths(line) == []


def test_no_tracked_file_names_a_path_outside_the_repository():
    hits = []
    for name in tracked_files():
        if name == THIS_FILE:
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: chunks and .npy files of the fixtures
            continue
        hits += [f"{name}:{n}: {line}" for n, line in outside_paths(data.decode("utf-8", errors="replace"))]
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)
