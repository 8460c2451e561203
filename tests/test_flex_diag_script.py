"""scripts/gpu/flex_diag.py (the GPU diagnostic of issue 32) runs on the CPU at small shapes: the
blocks and dense runs right, and its old-layout run (the block lists with the head axis at
stride 0, as before the fix) is off when the fused kernel is emulated from its lists."""

import pytest

from .scripts import load_script


@pytest.mark.slow
def test_flex_diag_runs_on_the_cpu(capsys):
    mod = load_script("scripts/gpu/flex_diag.py", register=True)
    rc = mod.main(["--device", "cpu", "--only", "small-trees", "--only", "mixed alibi"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2/2 batches right with blocks and dense" in out
    assert out.count("old-layout fused kernel emulated from its lists") == 2
    assert "kernel finds each row's own lists: NO" in out and "WRONG:" in out  # the old layout, shown wrong
    assert out.count("blocks: strides ok; kernel finds each row's own lists: yes") == 2
