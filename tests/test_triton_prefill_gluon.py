"""The Gluon prefill option's host side on the CPU (issue 33, prefill round 3): which batches it
takes, the 2-d TMA views of the caches (every key row of a page where the kernel's row formula
puts it), and that the option falls back to the prefill kernel where it cannot run (the CPU:
Gluon has no interpreter), with the reference's outputs. The kernel itself runs on a GPU:
tests/test_gluon_prefill_gpu.py."""
from __future__ import annotations

import pytest
import torch

from attnbench.backends import triton_prefill_gluon as gluon
from attnbench.workload.batch import BatchSpec, Request, materialize


@pytest.mark.parametrize("order", ["NHD", "HND"])
def test_kv_view_rows_follow_the_kernels_row_formula(order):
    spec = BatchSpec((Request("prefill", 40, 300),), 8, 2, 64, dtype="float16", page_size=128, kv_order=order,
                     layout="shuffled")
    b = materialize(spec, 3)
    for cache in (b.k_cache, b.v_cache):
        view, row_page, row_head, col_head = gluon._kv_view(cache)
        pages, page, heads, d = cache.shape
        for pg in (0, pages - 1):
            for h in range(heads):
                for slot in (0, 37, page - 1):
                    row = pg * row_page + h * row_head + slot
                    assert torch.equal(view[row, h * col_head:h * col_head + d], cache[pg, slot, h]), (order, pg, h)


def test_kv_view_refuses_a_strided_cache():
    b = materialize(BatchSpec((Request("prefill", 9, 0),), 4, 2, 64, dtype="float16", page_size=64), 1)
    assert gluon._kv_view(b.k_cache[:, :32]) is None


def test_fit_names_what_is_missing_on_the_cpu():
    b = materialize(BatchSpec((Request("prefill", 9, 0),), 4, 2, 64, dtype="float16", page_size=64), 1)

    class P:
        batch, cfg = b, None

    assert "Hopper" in gluon.fit(P())


def test_a_row_says_why_the_gluon_kernel_did_not_run():
    """On the CPU the option falls back (Gluon has no interpreter): the plan's mode, which a row
    reports as 'ran as', keeps 'interpreted' first and names the reason; a decode-only batch (not
    the prefill path's) adds nothing."""
    from attnbench.backends.triton_paged import TritonBackend

    be = TritonBackend(prefill="lean,fold,heavy,gluon")
    prefill = materialize(BatchSpec((Request("prefill", 9, 0), Request("decode", 1, 20)), 4, 2, 64,
                                    dtype="float16", page_size=64), 1)
    mode = be.plan(prefill).mode
    assert mode.startswith("interpreted") and "not Gluon's" in mode and "Hopper" in mode
    decode = materialize(BatchSpec((Request("decode", 1, 20),), 4, 2, 64, dtype="float16", page_size=64), 1)
    assert be.plan(decode).mode == "interpreted (TRITON_INTERPRET=1)"
    assert TritonBackend().plan(prefill).mode == "interpreted (TRITON_INTERPRET=1)"


def test_the_gluon_round_script_parses_and_names_existing_variants():
    """scripts/gpu/gpu_gluon_round.sh (one device call: the GPU tests and the timing rows) is valid bash
    and its default variants exist in scripts/dev/triton_variants.py."""
    import re
    import subprocess
    from pathlib import Path

    from .scripts import load_script

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "gpu_gluon_round.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    default = re.search(r'VARIANTS=\$\{VARIANTS:-"([^"]+)"\}', script.read_text()).group(1).split()
    names = {cls.name for cls in load_script("scripts/dev/triton_variants.py", "triton_variants_glr").VARIANTS}
    assert default and set(default) <= names, set(default) - names
