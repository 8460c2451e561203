"""Whether a triton row says it ran interpreted does not depend on backend order (issue 24
item 8): with the reference first, triton was not imported yet when its plan asked how it was
imported, and the row said nothing; with flex first (which imports triton), it said so.
Each order runs in a fresh process (triton reads TRITON_INTERPRET once, at import)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCENARIO = textwrap.dedent("""
    name: mode-note
    seed: 1
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 32, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 9}
    timing: {warmup_ms: 0, measure_ms: 1, min_runs: 2}
""")


@pytest.mark.slow
@pytest.mark.parametrize("first", ["reference", "sdpa"])
def test_the_interpreted_note_does_not_depend_on_order(tmp_path, first):
    s = tmp_path / "s.yaml"
    s.write_text(SCENARIO)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "attnbench", "run", str(s), "-b", first, "-b", "triton",
                          "--out", str(tmp_path / "run"), "-q", "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["backend"]: r for r in json.loads(res.stdout)}
    assert rows["triton"]["status"] == "ok" and rows["triton"]["mode"].startswith("interpreted"), rows["triton"]
