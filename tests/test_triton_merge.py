"""The triton backend's split merge (attnbench/kernels/merge.py) under the CPU interpreter: a block
of query heads a program, its last block partly past the heads (12 heads in blocks of 8, 6 in blocks of 4),
a padded head dim (96 in 128 lanes), 2-5 splits; every output row against the reference."""
from __future__ import annotations

import pytest

from attnbench.kernels.shared import launch as triton_launch
from attnbench.backends.triton import TritonBackend
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention


def test_merge_heads_keeps_a_programs_tile_within_its_budget():
    assert triton_launch.merge_heads(32, 2, 128) == 8
    assert triton_launch.merge_heads(12, 2, 64) == 16
    assert triton_launch.merge_heads(6, 4, 128) == 4
    assert triton_launch.merge_heads(32, 64, 128) == 1


@pytest.mark.slow
@pytest.mark.parametrize("hq,hkv,d,splits", [(12, 4, 96, 2), (12, 2, 32, 3), (6, 3, 128, 5), (8, 8, 64, 4)])
def test_split_rows_merge_to_the_reference(monkeypatch, hq, hkv, d, splits):
    monkeypatch.setattr(triton_launch, "MERGE_ELEMENTS", 4 * 128 * 4)  # blocks of heads that do not divide hq
    reqs = (Request("decode", 1, 300), Request("tree", 6, 211, (-1, 0, 0, 1, 1, 2)), Request("prefill", 9, 150))
    b = materialize(BatchSpec(reqs, hq, hkv, d, dtype="float32", page_size=16), 4)
    be = TritonBackend(splits=splits)
    p = be.plan(b)
    assert p.num_merge > 0
    assert compare(be.run(p), reference_attention(b)[0])[0] < 1e-4
