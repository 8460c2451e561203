"""A backend that is killed from outside mid-step (used with --backend-file by
tests/test_killed_runs.py): SDPA under another name whose ``convert`` of the page-size-8 case
touches the file named by $ATTNBENCH_TEST_MARKER and then sleeps, once (while that file does not
exist yet), so that a test can SIGKILL the run while this backend runs and resume it after."""
import os
import time
from pathlib import Path

from attnbench.backends.sdpa import SdpaBackend


class SleepsOnce(SdpaBackend):
    name = "sleeps_once"

    def convert(self, batch):
        marker = Path(os.environ.get("ATTNBENCH_TEST_MARKER", "/nonexistent/marker"))
        if batch.spec.page_size == 8 and marker.parent.is_dir() and not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(600)
        return super().convert(batch)
