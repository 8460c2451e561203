"""How the GPU tests (``-m gpu``) get a backend to test, and how they skip one: the one helper
of tests/test_variants_gpu.py and tests/test_lib_backends.py.

- xformers: the 0.0.35 wheel is built for torch 2.10; under torch 2.11 (the GPU machine's) its
  C++/CUDA extension does not load and xformers refuses even its Triton kernels. Its backend's
  Triton-only mode (option ``triton_only=on``, docs/backends.md) runs xformers' Triton split-K
  kernels there. The tests take that mode whenever the extension does not load (with or without
  ``ATTNBENCH_XFORMERS_TRITON_ONLY=1``), and say so: a warning in the test summary, and the
  plan's mode must start with ``triton-only``.
- Every skip names why the library cannot compute the batch; a reason saying a backend is held
  back "until fixed" is a failure, not a skip (issue 32: a wrong answer is not a library limit).
"""
from __future__ import annotations

import re
import warnings
from typing import Optional

import pytest

TRITON_ONLY_NOTE = ("xformers ran in Triton-only mode (xformers:triton_only=on): its C++/CUDA extension "
                    "does not load with this torch, so its Triton split-K kernels are what is tested")
#: skip reasons that are no library limitation
NOT_A_LIMIT = re.compile(r"until fixed", re.IGNORECASE)


def xformers_triton_only() -> bool:
    """True when xformers is installed and importable but its C++/CUDA extension did not load."""
    from attnbench.backend import Backend, get_backend_class

    if Backend.unavailable.__func__(get_backend_class("xformers")):  # not installed / not importable
        return False
    from attnbench.backends.xformers import triton_only

    return triton_only(True)


def gpu_backend(name: str) -> tuple[Optional[object], str]:
    """``(instance, "")`` for the backend ``name`` as the GPU tests run it, or ``(None, why)``
    when it cannot run on this machine at all (not installed, does not import). xformers whose
    extension does not load comes back in Triton-only mode (and warns so)."""
    from attnbench.backend import get_backend_class, make_backend

    if name == "xformers" and xformers_triton_only():
        be = make_backend("xformers:triton_only=on")
        why = be.why_unavailable()
        if not why:
            warnings.warn(TRITON_ONLY_NOTE, stacklevel=2)
        return (None, why) if why else (be, "")
    why = get_backend_class(name).unavailable()
    return (None, why) if why else (make_backend(name), "")


def skip_for(name: str, reasons: list[str]) -> None:
    """Skip with the backend's reasons, each a non-empty text naming a library limitation."""
    assert reasons and all(isinstance(r, str) and r for r in reasons), reasons
    held_back = [r for r in reasons if NOT_A_LIMIT.search(r)]
    assert not held_back, f"{name}: skipped for no library limitation: {held_back}"
    pytest.skip(f"{name}: " + "; ".join(reasons))
