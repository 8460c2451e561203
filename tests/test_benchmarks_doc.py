"""scripts/report/make_benchmarks_doc.py writes docs/benchmarks.md from run folders: its prose is
wrapped at 100 columns like every doc (tables aside), and a wrapped note stays one list item."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .scripts import ROOT


@pytest.mark.slow
def test_the_page_wraps_its_notes_and_keeps_each_one_list_item(tmp_path):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "attnbench", "run", "quickstart", "-b", "sdpa", "--device", "cpu", "-q",
                    "--warmup-ms", "1", "--measure-ms", "2", "--out", str(run)], cwd=ROOT, check=True,
                   capture_output=True)
    note = "these runs shared the host with " + "another job - " * 12 + "and the plan column reads high"
    out = tmp_path / "benchmarks.md"
    subprocess.run([sys.executable, "scripts/report/make_benchmarks_doc.py", str(run), "--command", "bash x.sh",
                    "--note", note, "--out", str(out), "--plots", str(tmp_path / "img")], cwd=ROOT, check=True,
                   capture_output=True)
    lines = out.read_text().splitlines()
    prose = [line for line in lines if not line.startswith("|")]
    assert all(len(line) <= 100 for line in prose), [line for line in prose if len(line) > 100]
    start = next(i for i, line in enumerate(lines) if line.startswith("- these runs shared"))
    item = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        item.append(line)
    assert len(item) > 1 and " ".join(x.strip() for x in item) == f"- {note}"
    assert not any(x.lstrip().startswith("- ") for x in item[1:])
