"""``--save-tensors``: each case's inputs and every backend's output in one ``.pt`` file,
loadable with ``torch.load(path, weights_only=True)``."""
from __future__ import annotations

from pathlib import Path

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.units import safe_name


def save_case_tensors(directory: Path, case_id: str, batch: Batch, outputs: dict) -> Path:
    """Write ``DIRECTORY/<case id>.pt``: the batch (q, paged K/V, block table, lengths, kinds,
    tree parents, scale) and ``outputs`` (backend name -> its checked first output, on the CPU)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    blob = {
        "q": batch.q.cpu(),
        "k_cache": batch.k_cache.cpu(),
        "v_cache": batch.v_cache.cpu(),
        "block_table": batch.block_table.cpu(),
        "query_lens": batch.query_lens.cpu(),
        "context_lens": batch.context_lens.cpu(),
        "kinds": batch.kinds,
        "tree_parents": batch.tree_parents,
        "scale": batch.scale,
        "outputs": outputs,
    }
    path = d / f"{safe_name(case_id)}.pt"
    torch.save(blob, path)
    return path
