"""Style as a habit: ``ruff check`` (configured in pyproject.toml) passes on the whole repository."""

import subprocess
import sys

from helpers import ROOT


def test_ruff_check_passes():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
