"""Import attnbench's Triton kernel modules under Triton's CPU interpreter, for the CPU tests.

``triton.jit`` reads TRITON_INTERPRET when a kernel module is imported, so the variable is set
around the import and restored after it. On a machine with a GPU it is not set: the kernels stay
compiled for the GPU tests of the same pytest session, and the interpreter tests re-run
themselves in a fresh interpreted process instead (tests/conftest.py imports triton compiled
first there)."""
from __future__ import annotations

import importlib
import os

import pytest
import torch


def import_interpreted(*names: str) -> list:
    """The modules ``names`` (skipping the test module when triton is missing), imported with
    TRITON_INTERPRET=1 where no GPU is."""
    saved = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton")
        return [importlib.import_module(n) for n in names]
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.fixture(autouse=True)
def interpret_on_cpu():
    """Autouse where a test module imports it: the CPU runs the kernels under Triton's interpreter,
    set by a patch of its own, so that a test's monkeypatch.undo() leaves TRITON_INTERPRET set."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        yield
