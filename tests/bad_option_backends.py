"""CPU backends with option declarations that cannot work, or that an environment variable can
break (loaded with --backend-file by tests/test_backend_options.py, issue 37 items 17 and 26)."""
from attnbench.backend import BackendOption
from attnbench.backends.sdpa import SdpaBackend


class BadDefault(SdpaBackend):
    name = "bad-default"
    options = {"flavor": BackendOption("flavor", "weird", choices=("plain", "fancy"))}


class LabelledSdpa(SdpaBackend):
    name = "labelled"
    options = {"label": BackendOption("label", "x", env="ATTNBENCH_TEST_LABEL", help="free text")}
