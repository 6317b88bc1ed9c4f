"""The optional mypyc build of the planner (tools/compile.py, `make compiled`) plans exactly as
pure Python: the same digest of plans over several clusters and settings, each build in its
own process. Skipped where no compiled build sits beside the sources (the default); `make test`
builds one for them at its end (`make test-compiled`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.builders import compile_tool

ROOT = Path(__file__).resolve().parents[2]
BUILT = sorted((ROOT / "controller").glob("*.so"))


def digest(mode: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "compiled_digest.py"), mode],
        check=True, capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "0"})
    return out.stdout.strip()


@pytest.mark.skipif(not BUILT, reason="no compiled build (make compiled)")
def test_the_compiled_build_is_made_from_the_sources() -> None:
    """Python imports a compiled module instead of its source: an edit after the build would
    be silently ignored."""
    build = compile_tool()
    assert build.STAMP.exists(), "controller/*.so without a stamp: run make compiled or make pure"
    assert build.STAMP.read_text() == build.source_hashes(), \
        "the compiled build is older than its sources: run make compiled (or make pure)"


@pytest.mark.skipif(not BUILT, reason="no compiled build (make compiled)")
def test_the_compiled_planner_gives_the_plans_of_the_pure_python_one() -> None:
    pure, compiled = digest("pure"), digest("compiled")
    assert len(pure) == 64
    assert compiled == pure
