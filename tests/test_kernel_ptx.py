"""scripts/dev/kernel_ptx.py: the triton backend's kernels compiled for sm_90 on a machine without a GPU (a
compile-only driver), and two dumps compared: identical code, the same code with its parameters renumbered
(arguments never read removed), or different."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .scripts import ROOT, load_script

SCRIPT = ROOT / "scripts" / "dev" / "kernel_ptx.py"


def _run(*args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_the_paged_route_compiles_for_sm90_and_two_dumps_compare(tmp_path):
    pytest.importorskip("triton")
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        r = _run("dump", ROOT, out, "--routes", "paged", tmp_path=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "paged-split: paged: paged_attention_kernel, merge_kernel" in r.stdout
    ptx = sorted(p.name for p in a.glob("*.ptx"))
    assert ptx == ["paged-f16-0-paged_attention_kernel.ptx", "paged-split-0-paged_attention_kernel.ptx",
                   "paged-split-1-merge_kernel.ptx"]
    assert ".target sm_90a" in (a / ptx[0]).read_text()
    r = _run("compare", a, b, tmp_path=tmp_path)
    assert r.returncode == 0 and "3 kernels, 0 different or missing" in r.stdout, r.stdout
    # one instruction changed in one kernel: that kernel, and only it, is different
    text = (b / ptx[2]).read_text()
    (b / ptx[2]).write_text(text.replace("ret;", "membar.gl;\n\tret;", 1))
    r = _run("compare", a, b, tmp_path=tmp_path)
    assert r.returncode == 1 and f"DIFFERENT        {ptx[2]}" in r.stdout and "1 different" in r.stdout, r.stdout


PTX = """.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
{params}
)
{{
\tld.param.b64 \t%rd1, [k_param_0];
\tld.param.b32 \t%r1, [k_param_{i}];
\tld.param.b32 \t%r2, [k_param_{j}];
\tret;
}}
\t.section\t.debug_info
\t.b8 {line}                                  // DW_AT_call_line
"""


def _ptx(n_params, i, j, line=7):
    params = ",\n".join(f"\t.param .u32 k_param_{p}" for p in range(1, n_params))
    return PTX.format(params=params, i=i, j=j, line=line)


def test_compare_tells_renumbered_parameters_from_other_changes():
    kp = load_script("scripts/dev/kernel_ptx.py")
    old = kp.code(_ptx(5, 2, 4, line=7))
    assert kp.code(_ptx(5, 2, 4, line=9)) == old  # debug sections (line numbers) are not code
    # arguments 1 and 3 never read, removed: 2 -> 1, 4 -> 2, order kept
    assert kp.same_but_params(old, kp.code(_ptx(3, 1, 2))) == {0: 0, 2: 1, 4: 2}
    assert kp.same_but_params(old, kp.code(_ptx(3, 2, 1))) is None  # two parameters swapped: other code
    assert kp.same_but_params(old, kp.code(_ptx(3, 1, 1))) is None  # two parameters made one
    changed = kp.code(_ptx(5, 2, 4)).replace("ret;", "trap;")
    assert kp.same_but_params(old, changed) is None
