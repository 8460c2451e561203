"""The backend contract, capability reasons, and the registry of backends.

A backend is a plugin (``from attnbench.backend import Backend, register``):

- declared capabilities (class attributes: ``dtypes``, ``head_dims``, ``page_size_multiple``,
  ``cuda_only``, ``max_group``, ``kinds``, ...) from which the base class writes the standard
  skip reasons, one wording each; ``unsupported(batch)`` adds what is special to the backend.
  The runner asks ``reasons(batch)``: both, an empty list meaning the backend can run it;
- ``convert(batch)`` (optional): what attnbench does only because the library cannot read
  this batch natively (K/V gathered out of the pages, dense masks no engine would build),
  timed apart as convert_ms. By default it returns the batch unchanged;
- ``plan(converted)``: the per-step work an engine does to turn its metadata into the
  library's launch inputs (the library's own plan call included), timed as plan_ms. It
  receives what ``convert`` returned (the batch itself by default) and returns a plan object;
  a ``mode`` attribute on that object (the route the plan chose) goes into the row;
- ``run(plan)`` launches the kernels and returns ``[N, Hq, D]``.

Why ``convert`` is a separate call whose result ``plan`` receives (and not a part the plan
reports about itself): the runner times each call on its own with the one host timer, so no
backend times itself; a backend that needs no conversion, or a plugin written before
``convert`` existed, implements plan/run only and gets ``convert_ms = 0``; and ``plan`` cannot
redo a conversion by accident, because it is handed the converted inputs.

Options: a backend declares ``options`` (``BackendOption``: choices or a type, a default, an
environment variable that may set it); ``-b NAME:key=value,...`` picks them, the instance reads
``self.option(key)``, and the row's backend is the canonical spec (``attnbench.backend_options``).

Backends are found by name in the built-in table below (imported lazily, so importing
attnbench never imports a GPU library), in the ``attnbench.backends`` entry-point group, or
in a file named with ``--backend-file`` (which runs that file's code).
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from attnbench.backend_reasons import head_dim_reasons, request_reasons, variant_reasons
from attnbench.backend_options import (
    BackendId, BackendOption, OptionError, ResolvedSpec, backend_name, parse_spec, resolve, suggest,
)
from attnbench.workload.mla import is_mla
from attnbench.workload.spec import KINDS  # the request kinds (docs/semantics.md), defined once there

if TYPE_CHECKING:  # torch is imported when a backend is, not with the registry
    import torch

    from attnbench.workload.batch import Batch


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


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
    supports_mla: ClassVar[bool] = False  # attention: mla (workload/mla.py); head-dim rules then unused
    #: declared options (``-b NAME:key=value``); see attnbench.backend_options
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
        cls = type(self)
        label = cls.label or cls.name
        out = []
        if cls.cuda_only and batch.device.type != "cuda":
            out.append(f"{label} runs on CUDA devices only")
        if cls.dtypes and batch.dtype not in cls.dtypes:
            names = "/".join(_dtype_name(d) for d in cls.dtypes)
            out.append(f"{label} takes {names}, not {_dtype_name(batch.dtype)}")
        if not is_mla(batch):
            out += head_dim_reasons(cls, label, batch.head_dim)
        elif not cls.supports_mla:
            out.append(f"{label} cannot compute multi-head latent attention (attention: mla: {batch.num_q_heads}"
                       f" query heads on one latent head of {batch.head_dim} dims, values of {batch.v_head_dim})")
        ps = batch.page_size
        if ps % cls.page_size_multiple:
            out.append(f"{label} needs page_size divisible by {cls.page_size_multiple}, got {ps}")
        if cls.max_page_size is not None and ps > cls.max_page_size:
            out.append(f"{label} takes page_size at most {cls.max_page_size}, got {ps}")
        hq, hkv = batch.num_q_heads, batch.num_kv_heads
        if hq % hkv:
            out.append(f"num_q_heads {hq} is not a multiple of num_kv_heads {hkv}")
        elif cls.max_group is not None and hq // hkv > cls.max_group:
            out.append(f"{label} takes at most {cls.max_group} query heads per KV head, got {hq // hkv}")
        out += request_reasons(cls, label, batch)
        out += variant_reasons(cls, label, batch.spec)
        return out

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


def device_reason(name: str, cuda_only: bool, cpu_env: Optional[str], device_type: str) -> Optional[str]:
    """See :meth:`Backend.device_reason` (a function, so that the listing of built-in
    backends can say it without importing them)."""
    if cuda_only and device_type != "cuda":
        return f"runs on CUDA devices only; this machine runs on {device_type}"
    if device_type == "cpu" and cpu_env and os.environ.get(cpu_env) != "1":
        return f"runs on a CPU only under {cpu_env}=1 (or name it with -b {name} to see its skipped rows)"
    return None


@dataclass(frozen=True)
class BuiltinInfo:
    """A built-in backend's class (``module:Class``, imported only when asked for) and the
    facts ``attnbench backends`` says of it without importing it (and so torch). Written once,
    here: the class takes them from this table (``Backend.__init_subclass__``)."""

    target: str
    library: Optional[str] = None
    install_hint: str = ""
    cuda_only: bool = False
    cpu_env: Optional[str] = None  # on a CPU only with this environment variable = 1
    distribution: Optional[str] = None  # whose version goes into rows and manifests
    option_envs: tuple[str, ...] = ()  # environment variables that set an option's default (sorted)


BUILTIN_FACTS = ("library", "install_hint", "cuda_only", "cpu_env", "distribution")
BUILTIN_INFO: dict[str, BuiltinInfo] = {
    "reference": BuiltinInfo("attnbench.backends.reference:ReferenceBackend"),
    "sdpa": BuiltinInfo("attnbench.backends.sdpa:SdpaBackend"),
    "flex": BuiltinInfo("attnbench.backends.flex:FlexBackend"),
    "triton": BuiltinInfo("attnbench.backends.triton_paged:TritonBackend", "triton", "pip install attnbench[triton]",
                          cpu_env="TRITON_INTERPRET", distribution="triton"),
    "flash-attn": BuiltinInfo(
        "attnbench.backends.flash_attn:FlashAttnBackend", "flash_attn",
        "pip install 'attnbench[flash-attn]' (builds from source; needs nvcc)", True, distribution="flash-attn",
        option_envs=("ATTNBENCH_FA2_HDIM128_ONLY",),
    ),
    "xformers": BuiltinInfo(
        "attnbench.backends.xformers:XformersBackend", "xformers",
        "pip install 'attnbench[xformers]' (the wheel must match your torch version)", True, distribution="xformers",
        option_envs=("ATTNBENCH_XFORMERS_TRITON_ONLY",),
    ),
    "flashinfer": BuiltinInfo(
        "attnbench.backends.flashinfer:FlashInferBackend", "flashinfer",
        "pip install 'attnbench[flashinfer]' (JIT needs nvcc, or add flashinfer-cubin / flashinfer-jit-cache)",
        True, distribution="flashinfer-python", option_envs=("ATTNBENCH_FLASHINFER_BACKEND", "ATTNBENCH_FLASHINFER_CASCADE"),
    ),
}
BUILTIN: dict[str, str] = {name: info.target for name, info in BUILTIN_INFO.items()}


class UnknownBackend(ValueError):
    """A backend name or spec no backend has (or an option it does not declare): exit 2."""


_EXTRA: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Register a backend class (used by ``--backend-file`` modules and tests)."""
    _EXTRA[cls.name] = cls
    return cls


def _entry_points() -> dict[str, Any]:
    try:
        return {ep.name: ep for ep in md.entry_points(group="attnbench.backends")}
    except Exception:  # a broken third-party distribution must not break the tool
        return {}


def loaded_names() -> list[str]:
    """Backends registered from Python (``--backend-file``, tests): their classes are at hand."""
    return list(_EXTRA)


def all_names() -> list[str]:
    names = list(BUILTIN)
    names += [n for n in _entry_points() if n not in names]
    names += [n for n in _EXTRA if n not in names]
    return names


def get_backend_class(name: str) -> type[Backend]:
    """The class of a registered name, or of a spec ``name:key=value`` (options ignored here)."""
    name = backend_name(name)
    if name in _EXTRA:
        return _EXTRA[name]
    if name in BUILTIN:
        module, cls = BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), cls)
    eps = _entry_points()
    if name in eps:
        return eps[name].load()
    raise unknown_backend(name)


def unknown_backend(name: str) -> UnknownBackend:
    """The error for a name no backend has: what it may have meant, and every valid name."""
    names = all_names()
    guesses = suggest(backend_name(name), names)
    hint = f"; did you mean {' or '.join(repr(g) for g in guesses)}?" if guesses else ""
    return UnknownBackend(f"unknown backend {name!r}{hint} (valid names: {', '.join(names)})")


def resolve_spec(spec: str) -> ResolvedSpec:
    """Validate a spec ``NAME[:key=value,...]`` against its backend's declared options
    (UnknownBackend naming the backend, the key and the allowed values otherwise)."""
    try:
        name, given = parse_spec(spec)
    except OptionError as e:
        raise UnknownBackend(str(e)) from None
    cls = get_backend_class(name)
    try:
        return resolve(name, given, dict(getattr(cls, "options", {}) or {}))
    except OptionError as e:
        raise UnknownBackend(str(e)) from None


def user_backend_id(text: str) -> BackendId:
    """What a user's backend text (``-b``, ``--baseline``, ``--normalize-by``, a ``-k`` word with a
    colon) names: a registered backend's spec resolved (``flex:mask=blocks`` is ``flex``, its
    default), an unregistered one (rows of another machine's backend) read by its syntax."""
    if backend_name(text) in all_names():
        return resolve_spec(text).id
    try:
        return BackendId.from_text(text)
    except OptionError as e:
        raise UnknownBackend(str(e)) from None


def resolve_values(spec: str, values: dict[str, str]) -> ResolvedSpec:
    """The spec with every option's value as recorded when its run began (the manifest's
    ``backend_specs``): the environment of this process changes nothing."""
    name = backend_name(spec)
    try:
        return resolve(name, dict(values), dict(getattr(get_backend_class(name), "options", {}) or {}))
    except OptionError as e:
        raise UnknownBackend(str(e)) from None


def canonical_spec(spec: str) -> str:
    """The identity string of a spec: the name plus the options that differ from the declared
    defaults (environment included), sorted: ``flashinfer:route=fa3``, or ``flashinfer``."""
    return resolve_spec(spec).canonical


def make_backend(spec: "str | ResolvedSpec") -> Backend:
    """An instance of the spec's backend with its options set (a spec resolved before, e.g. from
    the run's recorded values by ``resolve_values``: as is)."""
    rs = spec if isinstance(spec, ResolvedSpec) else resolve_spec(spec)
    be = get_backend_class(rs.name)()
    be.__dict__["_option_values"] = dict(rs.values)
    return be
