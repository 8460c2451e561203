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
    kept = tmp_path / "kept.md"
    kept.write_text("## Earlier session: kept\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    subprocess.run([sys.executable, "scripts/report/make_benchmarks_doc.py", f"{run}=abc1234", "--command", "bash x.sh",
                    "--command", "bash y.sh", "--note", note, "--out", str(out), "--plots", str(tmp_path / "img"),
                    "--append", str(kept)], cwd=ROOT, check=True, capture_output=True)
    text = out.read_text()
    lines = text.splitlines()
    # provenance: both calls' commands, and the scenario's own run with the commit given after its folder
    assert "bash x.sh\nbash y.sh\n" in text and "from 2 GPU calls" in text
    item = " ".join(x.strip() for x in text.split("\n- run ", 1)[1].split("\n\n", 1)[0].splitlines())
    assert item.startswith("20") and "at attnbench abc1234:" in item, item
    assert "`attnbench run quickstart -b sdpa --device cpu" in item and "host load average at its start" in item
    assert text.endswith(kept.read_text())
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
