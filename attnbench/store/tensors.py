"""``--save-tensors``: each case's inputs and every backend's output in one ``.pt`` file,
loadable with ``torch.load(path, weights_only=True)``.

The file is written after each backend's row (before the row is recorded), atomically, and
merged with the outputs already in it: a run stopped mid-case (SIGTERM, a crash) and resumed
ends with every backend's output in the case's file, never only those of the last process.
File names come from ``unique_file_stem``: two case ids never share a file.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Optional

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.units import unique_file_stem


def case_tensor_path(directory: Path, case_id: str) -> Path:
    return Path(directory) / f"{unique_file_stem(case_id)}.pt"


def _outputs_on_disk(path: Path, batch: Batch, case_id: str, run: Optional[str]) -> dict:
    """The outputs an earlier process of this run saved for this case (same run, case and
    inputs: a stopped run's, or an --isolate child's before a crash), else {}. A file of
    another run is replaced, never merged into."""
    if run is None or not path.is_file():
        return {}
    try:
        old = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # a damaged file: it is replaced
        return {}
    same = (isinstance(old, dict) and old.get("run") == run and old.get("case_id") == case_id
            and isinstance(old.get("q"), torch.Tensor)
            and torch.equal(old["q"], batch.q.cpu()) and isinstance(old.get("outputs"), dict))
    return dict(old["outputs"]) if same else {}


def save_case_tensors(directory: Path, case_id: str, batch: Batch, outputs: dict, merge: bool = False,
                      run: Optional[str] = None) -> Path:
    """Write ``DIRECTORY/<case id>.pt``: the case id, the batch (q, paged K/V, block table,
    lengths, kinds, tree parents, scale, attention and the MLA widths) and ``outputs`` (backend name -> its checked first
    output, on the CPU), with ``merge`` over the outputs the file already holds for this case
    of the same ``run`` (the first save of a case in a process; later ones hold all of them).

    The attention variants too (docs/semantics.md), so that ``scripts/gpu/check_saved.py`` can
    recompute from the file alone: ``causal`` per request, ``window``, ``softcap``, ``sinks``
    and ``alibi_slopes`` ([Hq] float32 or None), ``k_scale``/``v_scale`` (float32 [1] or [Hkv],
    None without FP8: K = k_cache.float() * k_scale), ``kv_dtype`` and ``kv_order`` (the caches
    are saved NHD-indexed whatever the storage order). The batch features of issue 59: ``k_scale``/
    ``v_scale`` also hold a 16-bit cache's given scales ([1]); ``context_lens`` is negative for a
    request with more queries than keys (kv_len = query + context); ``rope``, ``rope_theta``,
    ``rope_scale``; ``score_order``; ``q_dtype`` with ``q_fp8`` (the FP8 queries attention reads)
    and ``q_scale`` ([1] float32: Q = q_fp8.float() * q_scale), None without FP8 attention;
    ``out_dtype`` and ``out_scale`` (an FP8 output's values are output.float() * out_scale)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = case_tensor_path(d, case_id)
    blob = {
        "case_id": case_id,
        "run": run,
        "q": batch.q.cpu(),
        "k_cache": batch.k_cache.cpu().contiguous(),
        "v_cache": batch.v_cache.cpu().contiguous(),
        "block_table": batch.block_table.cpu(),
        "query_lens": batch.query_lens.cpu(),
        "context_lens": batch.context_lens.cpu(),
        "kinds": batch.kinds,
        "tree_parents": batch.tree_parents,
        "scale": batch.scale,
        "causal": batch.causal,
        "window": batch.window,
        "softcap": batch.softcap,
        "sinks": _cpu(batch.sinks),
        "alibi_slopes": _cpu(batch.alibi_slopes),
        "k_scale": _cpu(batch.k_scale),
        "v_scale": _cpu(batch.v_scale),
        "kv_dtype": batch.spec.kv_dtype,
        "kv_order": batch.kv_order,
        **_feature_fields(batch),
        "attention": batch.spec.attention,  # "mla": v_cache is k_cache[..., :kv_lora_rank]
        "kv_lora_rank": batch.spec.kv_lora_rank,
        "rope_dim": batch.spec.rope_dim,
        "outputs": {**(_outputs_on_disk(path, batch, case_id, run) if merge else {}), **outputs},
    }
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(blob, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _feature_fields(batch: Batch) -> dict:
    """The saved fields of issue 59's batch features (docs/semantics.md "Saved tensors")."""
    spec = batch.spec
    return {"rope": spec.rope, "rope_theta": spec.rope_theta, "rope_scale": spec.rope_scale,
            "score_order": spec.score_order, "q_dtype": spec.q_dtype, "q_fp8": _cpu(batch.q_fp8),
            "q_scale": _cpu(batch.q_scale), "out_dtype": spec.out_dtype, "out_scale": spec.out_scale}


OWNER_FILE = ".attnbench-owner"  # in a --save-tensors folder: the run folder whose case files it holds


def _legacy_owner(directory: Path) -> Optional[str]:
    """The run named by a case file of a folder an older attnbench filled (no owner file):
    the ``run`` of any ``.pt`` file that names one, every file read (memory-mapped: only the
    small fields are read), so that stray files named before the case files hide nothing."""
    for f in sorted(Path(directory).glob("*.pt")):
        try:
            blob = torch.load(f, weights_only=True, map_location="cpu", mmap=True)
        except Exception:  # not a case file of ours
            continue
        if isinstance(blob, dict) and isinstance(blob.get("run"), str):
            return blob["run"]
    return None


def check_tensors_folder(directory: Optional[Path], out: Optional[Path]) -> None:
    """Refuse, before a new run starts, a ``--save-tensors`` folder that cannot be a run's own:
    a run folder (another's, or this run's own ``--out``), a folder inside another run folder.
    Whether another run owns it is decided by ``claim_tensors_folder``. RunFolderError names the
    flag, the folder and the fix."""
    if directory is None:
        return
    from attnbench.store.outputs import is_run_folder as _is_run_folder
    from attnbench.store.runfolder import RunFolderError

    d = Path(os.path.realpath(directory))
    own = Path(os.path.realpath(out)) if out is not None else None
    fix = _fix(out)
    if d == own or (d.is_dir() and _is_run_folder(d)):
        raise RunFolderError(f"--save-tensors {directory}: a run folder (its case files would sit among the run's "
                             f"files, and replace another run's); {fix}")
    for parent in d.parents:
        if parent == own:
            break  # inside this run's own folder (--out R --save-tensors R/tensors): its own
        if _is_run_folder(parent):
            raise RunFolderError(f"--save-tensors {directory}: inside the run folder {parent}, whose files are its own; "
                                 f"{fix}")


def _fix(out) -> str:
    return f"choose a folder of its own, e.g. {Path(out) / 'tensors'}" if out is not None else \
        "choose a new folder for this run's tensors"


def claim_tensors_folder(directory: Optional[Path], run: str, out: Optional[Path] = None) -> None:
    """Make the run folder ``run`` the owner of the ``--save-tensors`` folder ``directory``
    (made if new), or refuse (RunFolderError) when another run folder that still exists owns
    it. The owner is named in ``OWNER_FILE``, read and written under an exclusive lock of that
    file: of two runs started at once into one folder, one owns it and the other is refused
    (an owner check that looked for case files passed both while neither had written one). A
    folder whose owner was removed is taken over; one an older attnbench filled, without the
    file, is owned by the run its case files name."""
    if directory is None:
        return
    from attnbench.store.runfolder import RunFolderError

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / OWNER_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        _lock(fd)  # released when fd is closed
        owner = os.read(fd, 1 << 16).decode(errors="replace").strip() or _legacy_owner(d)
        if owner and os.path.realpath(owner) != os.path.realpath(run) and os.path.isdir(owner):
            raise RunFolderError(f"--save-tensors {directory}: holds the case files of the run {owner} (it owns the "
                                 f"folder: {d / OWNER_FILE}); this run would replace them (their outputs lost): "
                                 f"{_fix(out)}, or remove that run's folder first")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{run}\n".encode(), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): two runs started at the same instant are up to the user
        return
    fcntl.flock(fd, fcntl.LOCK_EX)


def _cpu(t):
    return None if t is None else t.cpu()
