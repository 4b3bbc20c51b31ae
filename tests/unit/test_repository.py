"""The repository names no file or path outside itself: no directory above the clone (a build
machine's layout), no home directory, no Markdown notes kept beside it (every tracked file, as
`git ls-files` lists it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support import REPO

# A path starts a token: `meta/root/` (a v3 draft's key) is not an absolute path.
_START = r"(?<![\w./-])"
# A Markdown file named alone (`NOTES.md`), as notes kept beside a repository are; one named with
# its directory (docs/VIEWS.md, another project's developer-notes/x.md) says where it is.
MARKDOWN = re.compile(r"(?<![\w./-])([A-Za-z][\w-]*\.md)\b")
THIS_FILE = "tests/unit/test_repository.py"  # its examples name made-up files


def outside_paths(text: str, above: list[str], known_markdown: set[str]) -> list[tuple[int, str]]:
    """(line number, line) of each line of TEXT that names a directory in ABOVE (absolute paths
    outside the repository), or a Markdown file whose name no file in KNOWN_MARKDOWN has."""
    dirs = [re.escape(d.rstrip("/")) for d in above if d.rstrip("/")]
    path = re.compile(rf"{_START}(?:{'|'.join(dirs)})/") if dirs else None
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        if (path is not None and path.search(line)) or any(m not in known_markdown for m in MARKDOWN.findall(line)):
            hits.append((n, line.strip()))
    return hits


def tracked_files() -> list[str]:
    try:
        r = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        pytest.fail("git is not installed: the repository check lists the tracked files with it", pytrace=False)
    if r.returncode != 0:
        pytest.fail(f"git ls-files failed in {REPO}: {r.stderr.decode(errors='replace').strip()}", pytrace=False)
    return [name for name in r.stdout.decode().split("\0") if name]


# Top-level directories the product itself names (/tmp/zarrfs-demo, /var/cache/zarrfs, /srv/data,
# ...): a clone whose parent is one of them does not make them outside paths.
SYSTEM_DIRS = {Path(f"/{d}") for d in ("", "tmp", "var", "opt", "usr", "srv", "mnt", "home", "run", "dev")}


def outside_directories() -> list[str]:
    """What lies outside the clone on this machine: the directory holding it and the one above
    (where a team keeps its notes), and the user's home."""
    repo = REPO.resolve()
    return sorted({str(d) for d in (repo.parent, repo.parent.parent, Path.home()) if d not in SYSTEM_DIRS})


@pytest.mark.parametrize(
    "line",
    [
        "see /build/ci/notes/FIGURES.md for the figures",
        "measured on the build machine (/build/ci/zarrfs/.venv)",
        "cp /home/alice/data.zarr .",
        "the user contract (CONTRACT.md)",
        "as `TEAM-NOTES.md` asks",
    ],
)
def test_outside_paths_are_found(line):
    above = ["/build/ci", "/home/alice"]
    assert outside_paths(f"first line\n{line}\n", above, {"README.md", "VIEWS.md"}) == [(2, line)]


@pytest.mark.parametrize(
    "line",
    [
        "meta/root/g/notes.txt and data/root/P/c0/0 (the drafts' keys)",
        "`~/.cache/zarrfs` for other users",
        "/usr/share/doc and /var/cache/zarrfs",
        "/build/cider/x is another directory; the /build/ci prefix is a word",
        "[views](docs/VIEWS.md#the-tree), README.md",
    ],
)
def test_paths_of_the_product_are_not_outside_paths(line):
    assert outside_paths(line, ["/build/ci", "/home/alice"], {"README.md", "VIEWS.md"}) == []


def test_no_tracked_file_names_a_path_outside_the_repository():
    names = tracked_files()
    known_markdown = {Path(n).name for n in names if n.endswith(".md")}
    above = outside_directories()
    hits = []
    for name in names:
        if name == THIS_FILE:
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: chunks and .npy files of the fixtures
            continue
        text = data.decode("utf-8", errors="replace")
        hits += [f"{name}:{n}: {line}" for n, line in outside_paths(text, above, known_markdown)]
    assert not hits, f"paths outside the repository ({', '.join(above)}, or Markdown it lacks):\n" + "\n".join(hits)
