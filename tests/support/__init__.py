"""Code the tests share: mount control, store builders, oracles, fixtures' paths (never the code under test)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
BENCHMARKS = REPO / "benchmarks"
# zarr-python 2.18 (numpy<2), an oracle of the v3 drafts, in a venv of its own that
# scripts/test.sh makes in the repository.
ZARR218_PYTHON = Path(os.environ.get("ZARR218_PYTHON", REPO / ".venv-zarr218" / "bin" / "python"))
SUPPORT = Path(__file__).resolve().parent
