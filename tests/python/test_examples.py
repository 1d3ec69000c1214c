"""examples/qat_example.py runs and its loss goes down (it exits non-zero otherwise)."""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "qat_example.py")


def test_qat_example_trains():
    r = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss went down" in r.stdout
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) >= 5 and losses[-1] < losses[0]


def test_docs_python_md_code_runs():
    """Every ```python block of docs/python.md runs."""
    import re

    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
    with open(doc, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), {})
