"""The backend contract: the ``Backend`` base class every backend subclasses (its declared
capabilities, from which the standard skip reasons are written, ``convert``/``plan``/``run``,
options, availability and version). What each call does and why: the package docstring
(``attnbench.backend``)."""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from attnbench.backend.builtin import BUILTIN_FACTS, BUILTIN_INFO
from attnbench.backend.options import BackendOption, resolve
from attnbench.backend.reasons import capability_reasons, device_reason
from attnbench.workload.spec import KINDS  # the request kinds (docs/semantics.md), defined once there

if TYPE_CHECKING:  # torch is imported when a backend is, not with the registry
    import torch

    from attnbench.workload.batch import Batch


class Backend(ABC):
    """Base class of every backend. Subclasses set ``name`` and implement plan/run; they
    declare what they can compute in the class attributes below (the defaults accept
    everything, so a plugin that declares nothing is never skipped by them)."""

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

    # -- declared capabilities: the standard reasons are built from these ------------------
    #: how reasons name the kernel ("flash-attn 2"); empty: ``name``
    label: ClassVar[str] = ""
    #: input dtypes the kernels take; empty: any
    dtypes: ClassVar[tuple[torch.dtype, ...]] = ()
    #: head dims the kernels take; empty: any within head_dim_multiple / max_head_dim
    head_dims: ClassVar[tuple[int, ...]] = ()
    head_dim_multiple: ClassVar[int] = 1
    max_head_dim: ClassVar[Optional[int]] = None
    #: the page size must be a multiple of this, and at most ``max_page_size``
    page_size_multiple: ClassVar[int] = 1
    max_page_size: ClassVar[Optional[int]] = None
    #: the kernels run on CUDA tensors only
    cuda_only: ClassVar[bool] = False
    #: an environment variable that must be "1" for it to run on a CPU (triton's interpreter)
    cpu_env: ClassVar[Optional[str]] = None
    #: GQA: query heads per KV head at most this (None: any); every backend needs
    #: num_q_heads to be a multiple of num_kv_heads
    max_group: ClassVar[Optional[int]] = None
    #: request kinds the backend computes
    kinds: ClassVar[tuple[str, ...]] = KINDS
    #: distinct tree shapes one batch may hold (None: any)
    max_tree_shapes: ClassVar[Optional[int]] = None
    #: every tree request needs a prefix (context >= 1)
    trees_need_context: ClassVar[bool] = False
    # Attention variants (docs/semantics.md). Unlike the shapes above, these default to "no":
    # a backend that declares nothing gives a skipped row for a batch that uses them rather
    # than a wrong answer; each owner turns a feature on with its real route.
    supports_window: ClassVar[bool] = False  # model.window (sliding window on positions)
    supports_sinks: ClassVar[bool] = False  # model.sinks (a sink logit per query head)
    supports_softcap: ClassVar[bool] = False  # model.softcap
    supports_alibi: ClassVar[bool] = False  # model.alibi
    supports_noncausal: ClassVar[bool] = False  # prefill groups with causal: false
    #: FP8 cache dtypes read ("fp8_e4m3", "fp8_e5m2"); a cache in the model dtype always is
    kv_dtypes: ClassVar[tuple[str, ...]] = ()
    #: FP8 scale granularities read with them ("per-tensor", "per-head")
    kv_scales: ClassVar[tuple[str, ...]] = ("per-tensor",)
    #: cache storage orders read ("NHD", "HND")
    kv_orders: ClassVar[tuple[str, ...]] = ("NHD",)
    # Batch features of issue 59 (docs/semantics.md), each off until its owner turns it on:
    supports_16bit_kv_scales: ClassVar[bool] = False  # kv_cache.k_scale / v_scale on a model-dtype cache
    supports_short_kv: ClassVar[bool] = False  # non-causal prefills with more queries than keys (kv_len)
    supports_rope: ClassVar[bool] = False  # model.rope: rotary on q and k, in the kernel or in convert
    supports_alibi_before_softcap: ClassVar[bool] = False  # model.score_order: alibi-softcap
    #: FP8 query dtypes read natively (model.q_dtype: FP8 attention); empty: none
    q_dtypes: ClassVar[tuple[str, ...]] = ()
    #: FP8 output dtypes written (model.out_dtype: run returns the FP8 tensor); empty: none
    out_dtypes: ClassVar[tuple[str, ...]] = ()
    supports_mla: ClassVar[bool] = False  # attention: mla (workload/mla.py); head-dim rules then unused
    #: declared options (``-b NAME:key=value``); see attnbench.backend.options
    options: ClassVar[dict[str, BackendOption]] = {}

    def __init_subclass__(cls, **kwargs):
        """A built-in backend's class takes its library, install hint, device needs and
        distribution from ``BUILTIN_INFO`` (one definition, readable without importing it)."""
        super().__init_subclass__(**kwargs)
        info = BUILTIN_INFO.get(cls.__dict__.get("name", ""))
        if info is not None and info.target == f"{cls.__module__}:{cls.__qualname__}":
            for fact in BUILTIN_FACTS:
                setattr(cls, fact, getattr(info, fact))

    def option(self, key: str) -> str:
        """The value of option ``key`` for this instance (its canonical text: a choice, a
        number, ``on``/``off``): as given in the spec, else the environment's or the declared
        default. An instance made without a spec (``cls()``) sees the defaults."""
        values = self.__dict__.get("_option_values")
        if values is None:
            values = self.__dict__["_option_values"] = resolve(type(self).name, {}, type(self).options).values
        return values[key]

    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why this backend cannot run on this machine at all, or None. A dotted ``library``
        (``flash_attn.cute``) is looked up by importing its parents, which may be missing or fail
        (flash-attn 2's ``flash_attn/__init__`` loading its extension): each is a reason."""
        if cls.library:
            try:
                found = importlib.util.find_spec(cls.library) is not None
            except ModuleNotFoundError:  # a parent package is missing
                found = False
            except Exception as e:  # a parent package's __init__ failed
                parent = cls.library.rsplit(".", 1)[0]
                return f"{parent} does not import: {type(e).__name__}: {e}"
            if not found:
                hint = f"; install with: {cls.install_hint}" if cls.install_hint else ""
                return f"{cls.library} not installed{hint}"
        for module in cls.import_modules:
            try:
                importlib.import_module(module)
            except Exception as e:
                return f"{cls.library} does not import: {type(e).__name__}: {e}"
        return None

    @classmethod
    def device_reason(cls, device_type: str) -> Optional[str]:
        """Why every case would be skipped on this device type (so a default run leaves
        this backend out; naming it with -b still gives its skipped rows), or None."""
        return device_reason(cls.name, cls.cuda_only, cls.cpu_env, device_type)

    @classmethod
    def version(cls) -> str:
        dist = cls.distribution or cls.library
        if dist is None:
            import torch

            return f"torch {torch.__version__}"
        try:
            return f"{dist} {md.version(dist)}"
        except md.PackageNotFoundError:
            mod = importlib.import_module(cls.library) if cls.library else None
            return f"{dist} {getattr(mod, '__version__', 'unknown')}"

    def why_unavailable(self) -> Optional[str]:
        """:meth:`unavailable` for this instance's options (an option may make it runnable)."""
        return type(self).unavailable()

    def reasons(self, batch: Batch) -> list[str]:
        """Every reason this backend cannot compute ``batch`` exactly ([] means it can): the
        declared capabilities' (:meth:`capability_reasons`), then :meth:`unsupported`'s."""
        return self.capability_reasons(batch) + list(self.unsupported(batch))

    def capability_reasons(self, batch: Batch) -> list[str]:
        """The standard reasons, from the declared capabilities (one wording each)."""
        return capability_reasons(type(self), batch)

    def unsupported(self, batch: Batch) -> list[str]:
        """Reasons special to this backend, beyond its declared capabilities ([] by default)."""
        return []

    def convert(self, batch: Batch) -> Any:
        """What attnbench does only because the library cannot read ``batch`` natively
        (timed apart, as convert_ms); its result is what :meth:`plan` receives. Default: none,
        the batch itself."""
        return batch

    @abstractmethod
    def plan(self, batch: Any) -> Any:
        """The engine's per-step metadata work (timed apart from ``run``, as plan_ms). Receives
        what :meth:`convert` returned (the batch, unless ``convert`` is overridden)."""

    @abstractmethod
    def run(self, plan: Any) -> torch.Tensor:
        """Launch the kernels; return the output ``[N, Hq, D]`` in the batch's dtype."""

    def prepare(self, batch: Batch) -> Any:
        """``plan(convert(batch))``: the whole host-side step, for callers that do not time it."""
        return self.plan(self.convert(batch))

    @classmethod
    def working_set_bytes(cls, spec: Any, device_type: str) -> int:
        """Bytes this backend allocates for a batch of ``spec`` (a ``BatchSpec``) beyond its
        own copy of the inputs and its output: converted copies, masks, scores. The runner's
        memory guard skips the backend when they do not fit (0: nothing beyond those)."""
        return 0

    @classmethod
    def converts(cls) -> bool:
        """True when the backend overrides :meth:`convert` (its rows report convert_ms)."""
        return cls.convert is not Backend.convert
