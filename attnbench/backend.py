"""The backend contract, capability reasons, and the registry of backends.

A backend is a plugin: ``unsupported(batch)`` lists reasons it cannot run a batch (an empty
list means it can), ``plan(batch)`` builds whatever metadata its library needs (timed apart,
as plan_ms), and ``run(plan)`` launches the kernels and returns ``[N, Hq, D]``.
Backends are found by name in the built-in table below (imported lazily, so importing
attnbench never imports a GPU library), in the ``attnbench.backends`` entry-point group, or
in a file named with ``--backend-file`` (which runs that file's code).
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch

from attnbench.workload.batch import Batch


class Backend(ABC):
    """Base class of every backend. Subclasses set ``name`` and implement plan/run."""

    name: ClassVar[str]
    #: import name of the wrapped library (``None`` for torch-only backends)
    library: ClassVar[Optional[str]] = None
    #: distribution name whose version goes into rows and manifests
    distribution: ClassVar[Optional[str]] = None
    install_hint: ClassVar[str] = ""
    #: False if ``run`` cannot be captured in a CUDA graph; the timer then uses events.
    capturable: ClassVar[bool] = True
    #: modules imported to tell "installed" from "importable" (a binary built for another
    #: torch fails only at import); empty: finding the library is enough
    import_modules: ClassVar[tuple[str, ...]] = ()
    #: a short note each row of this backend carries (e.g. "triton-only mode")
    mode: str = ""

    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why this backend cannot run on this machine at all, or None."""
        if cls.library and importlib.util.find_spec(cls.library) is None:
            hint = f"; install with: {cls.install_hint}" if cls.install_hint else ""
            return f"{cls.library} not installed{hint}"
        for module in cls.import_modules:
            try:
                importlib.import_module(module)
            except Exception as e:
                return f"{cls.library} does not import: {type(e).__name__}: {e}"
        return None

    @classmethod
    def version(cls) -> str:
        dist = cls.distribution or cls.library
        if dist is None:
            return f"torch {torch.__version__}"
        try:
            return f"{dist} {md.version(dist)}"
        except md.PackageNotFoundError:
            mod = importlib.import_module(cls.library) if cls.library else None
            return f"{dist} {getattr(mod, '__version__', 'unknown')}"

    def unsupported(self, batch: Batch) -> list[str]:
        """Reasons this backend cannot compute ``batch`` exactly; [] means it can."""
        return []

    @abstractmethod
    def plan(self, batch: Batch) -> Any:
        """Build metadata / convert layouts. Timed apart from ``run`` (plan_ms)."""

    @abstractmethod
    def run(self, plan: Any) -> torch.Tensor:
        """Launch the kernels; return the output ``[N, Hq, D]`` in the batch's dtype."""


def basic_reasons(batch: Batch, library: str, cuda_only: bool = True, dtypes: tuple = ()) -> list[str]:
    """The reasons most library backends share: a CUDA-only kernel, 16-bit-only inputs, and
    query heads that are not a whole number of groups per KV head."""
    reasons = []
    if cuda_only and batch.device.type != "cuda":
        reasons.append(f"{library} runs on CUDA devices only")
    if dtypes and batch.dtype not in dtypes:
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        reasons.append(f"{library} takes {names}, not {str(batch.dtype).replace('torch.', '')}")
    if batch.num_q_heads % batch.num_kv_heads:
        reasons.append(f"num_q_heads {batch.num_q_heads} is not a multiple of num_kv_heads {batch.num_kv_heads}")
    return reasons


# name -> "module:Class", imported only when asked for.
BUILTIN: dict[str, str] = {
    "reference": "attnbench.backends.reference:ReferenceBackend",
    "sdpa": "attnbench.backends.sdpa:SdpaBackend",
    "flex": "attnbench.backends.flex:FlexBackend",
    "triton": "attnbench.backends.triton_paged:TritonBackend",
    "flash-attn": "attnbench.backends.flash_attn:FlashAttnBackend",
    "xformers": "attnbench.backends.xformers:XformersBackend",
    "flashinfer": "attnbench.backends.flashinfer:FlashInferBackend",
}


class UnknownBackend(ValueError):
    pass


_EXTRA: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Register a backend class (used by ``--backend-file`` modules and tests)."""
    _EXTRA[cls.name] = cls
    return cls


def load_backend_file(path: str | Path) -> list[str]:
    """Import a user's Python file (this RUNS its code) and register its Backend subclasses."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"attnbench_user_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UnknownBackend(f"--backend-file {path}: not a Python file that can be imported")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = []
    for obj in vars(mod).values():
        if isinstance(obj, type) and issubclass(obj, Backend) and obj is not Backend and getattr(obj, "name", None):
            register(obj)
            names.append(obj.name)
    if not names:
        raise UnknownBackend(f"--backend-file {path}: defines no Backend subclass with a `name`")
    return names


def _entry_points() -> dict[str, Any]:
    try:
        return {ep.name: ep for ep in md.entry_points(group="attnbench.backends")}
    except Exception:  # a broken third-party distribution must not break the tool
        return {}


def all_names() -> list[str]:
    names = list(BUILTIN)
    names += [n for n in _entry_points() if n not in names]
    names += [n for n in _EXTRA if n not in names]
    return names


def get_backend_class(name: str) -> type[Backend]:
    if name in _EXTRA:
        return _EXTRA[name]
    if name in BUILTIN:
        module, cls = BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), cls)
    eps = _entry_points()
    if name in eps:
        return eps[name].load()
    raise UnknownBackend(f"unknown backend {name!r}; valid names: {', '.join(all_names())}")
