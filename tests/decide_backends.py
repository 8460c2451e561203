"""A CPU backend for tests/test_decide.py (loaded with --backend-file): SDPA that declares it
cannot run trees, so it is `ok` on the decode/prefill shapes of a trace and `skipped` on the
shapes with a speculative verify."""
from attnbench.backends.sdpa import SdpaBackend


class SdpaNoTree(SdpaBackend):
    name = "sdpa-notree"
    kinds = ("prefill", "decode")
