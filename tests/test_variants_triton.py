"""The triton backend on the attention variants, under Triton's interpreter in a fresh process
(``triton.jit`` reads TRITON_INTERPRET at import, so a subprocess is the one safe way whatever
this process imported first): for each feature alone and all together, on trees, chunked and
non-causal prefills, page sizes 1 and 3, shuffled pages, triton either matches the float64
reference (float32 and float16 only: bfloat16 ``tl.dot`` is wrong in the interpreter) or gives
its reasons (a skipped row), never a wrong answer."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, %r)
    from tests.test_variants import FEATURES, MIXED, batch_for
    from attnbench.backends.triton import TritonBackend
    from attnbench.workload.reference import compare, reference_attention
    out = {}
    causal = [r for r in MIXED if r.causal]
    for feature in [*FEATURES, "noncausal"]:
        for page_size in (1, 3):
            reqs = MIXED if feature == "noncausal" else causal
            b = batch_for("plain" if feature == "noncausal" else feature, dtype="float16", seed=page_size,
                          page_size=page_size, requests=reqs, d=32)
            be = TritonBackend()
            reasons = be.reasons(b)
            if reasons:
                out[f"{feature}/{page_size}"] = {"reasons": reasons}
                continue
            ref, _ = reference_attention(b)
            o = be.run(be.prepare(b))
            out[f"{feature}/{page_size}"] = {"rel": compare(o, ref)[0], "dtype": str(o.dtype)}
    print("RESULT " + json.dumps(out))
    """
) % str(ROOT)


@pytest.mark.slow
def test_triton_on_every_feature_or_its_reasons():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-3000:]
    results = json.loads(line[0][len("RESULT "):])
    assert len(results) == 2 * 11
    for key, res in results.items():
        if "reasons" in res:
            assert res["reasons"] and all(len(x) > 20 for x in res["reasons"]), (key, res)
        else:
            assert res["dtype"] == "torch.float16" and res["rel"] < 5e-3, (key, res)
    assert "rel" in results["plain/1"], results["plain/1"]  # plain batches always run
