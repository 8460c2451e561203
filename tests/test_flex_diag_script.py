"""scripts/gpu/flex_diag.py (the GPU diagnostic of issue 32) runs on the CPU at small shapes: the
blocks and dense runs right, and its old-layout run (the block lists with the head axis at
stride 0, as before the fix) is off when the fused kernel is emulated from its lists."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_flex_diag_runs_on_the_cpu(capsys):
    spec = importlib.util.spec_from_file_location("flex_diag", ROOT / "scripts" / "gpu" / "flex_diag.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["flex_diag"] = mod
    spec.loader.exec_module(mod)
    rc = mod.main(["--device", "cpu", "--only", "small-trees", "--only", "mixed alibi"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2/2 batches right with blocks and dense" in out
    assert out.count("old-layout fused kernel emulated from its lists") == 2
    assert "kernel finds each row's own lists: NO" in out and "WRONG:" in out  # the old layout, shown wrong
    assert out.count("blocks: strides ok; kernel finds each row's own lists: yes") == 2
