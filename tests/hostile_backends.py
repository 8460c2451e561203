"""Backends from the third hostile campaign (issue 25), used with --backend-file.

Not collected by pytest (no test_ prefix). Each computes the right output (``_Good``) and
misbehaves around it: ``chdir`` moves the process's working directory (to the folder in
ATTNBENCH_TEST_CHDIR) in its plan; ``term_once`` sends SIGTERM to its own process in its
first run while the file ATTNBENCH_TEST_MARK does not exist (and creates it), so a resumed
run passes.
"""
import os
import signal
from pathlib import Path

from attnbench.backend import Backend


class _Right(Backend):
    name = "_right_base"

    def plan(self, batch):
        from attnbench.workload.reference import reference_attention

        self.out = reference_attention(batch)[0].to(batch.dtype)
        return batch

    def run(self, batch):
        return self.out.clone()


class Chdir(_Right):
    name = "chdir"

    def plan(self, batch):
        os.chdir(os.environ["ATTNBENCH_TEST_CHDIR"])
        return super().plan(batch)


class TermOnce(_Right):
    name = "term_once"

    def run(self, batch):
        mark = Path(os.environ["ATTNBENCH_TEST_MARK"])
        if not mark.exists():
            mark.write_text("sent")
            os.kill(os.getpid(), signal.SIGTERM)
        return super().run(batch)
