"""The README's store example runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_store_example_runs(tmp_path: Path) -> None:
    section = README.read_text().split("### The store\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    result = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    assert "status='succeeded'" in result.stdout
    assert (tmp_path / "runs" / "demo" / "store.sqlite").exists()
