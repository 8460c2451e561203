"""The built-in backends: where each class lives and what can be said of it without importing
it (and so torch or its library): ``attnbench backends`` lists them from this table alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
    "triton": BuiltinInfo("attnbench.backends.triton:TritonBackend", "triton", "pip install attnbench[triton]",
                          cpu_env="TRITON_INTERPRET", distribution="triton"),
    "flash-attn": BuiltinInfo(
        "attnbench.backends.flash_attn:FlashAttnBackend", "flash_attn",
        "pip install 'attnbench[flash-attn]' (builds from source; needs nvcc)", True, distribution="flash-attn",
        option_envs=("ATTNBENCH_FA2_HDIM128_ONLY",),
    ),
    "flash-attn4": BuiltinInfo(
        "attnbench.backends.flash_attn4:FlashAttn4Backend", "flash_attn.cute",
        "pip install 'attnbench[flash-attn4]' (flash-attn-4 and the CuTe DSL; offline: docs/backends.md, "
        "scripts/gpu/fetch_wheels.sh)", True, distribution="flash-attn-4",
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
