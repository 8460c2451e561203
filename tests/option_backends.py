"""A CPU backend with declared options (loaded with --backend-file by tests/test_backend_options.py):
SDPA under another name, whose ``flavor`` option changes nothing it computes but is part of its
identity, and whose ``bias`` option adds a constant to its output (so a wrong option shows)."""
from attnbench.backend import BackendOption
from attnbench.backends.sdpa import SdpaBackend


class OptionedSdpa(SdpaBackend):
    name = "sdpa-opt"
    options = {
        "flavor": BackendOption("flavor", "plain", choices=("plain", "fancy"), env="ATTNBENCH_TEST_FLAVOR",
                                help="a label"),
        "bias": BackendOption("bias", 0.0, type=float, help="added to the output"),
    }

    def run(self, plan):
        return super().run(plan) + float(self.option("bias"))
