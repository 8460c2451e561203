"""Backends that compute the right output but then damage their inputs (or return one of
them as the output): each must get an ``error`` row, and the backends after it must not
notice. Not collected by pytest (no test_ prefix)."""
import threading
import time

from .misbehaving_backends import _Good as _Right  # computes the right output in plan, copies it in run


class WritesKCache(_Right):
    name = "writes-k-cache"

    def run(self, batch):
        out = self.out.clone()
        batch.k_cache.mul_(1.5)  # after the output is computed: its own row still checks ok
        return out


class WritesQ(_Right):
    name = "writes-q"

    def run(self, batch):
        out = self.out.clone()
        batch.q[0].zero_()
        return out


class WritesBlockTable(_Right):
    name = "writes-block-table"

    def run(self, batch):
        out = self.out.clone()
        batch.block_table[:, 0] = batch.block_table[:, 0] + 1  # never undone by the next call
        return out


class OutputIsQ(_Right):
    name = "output-is-q"

    def run(self, batch):
        batch.q.copy_(self.out)  # computes "in place" into its input and returns it
        return batch.q


class LateWriter(_Right):
    """Leaves a thread behind that keeps writing into V for a while after each call."""

    name = "late-writer"

    def run(self, batch):
        v = batch.v_cache

        def scribble():
            for _ in range(200):
                v.add_(1.0)
                time.sleep(0.002)

        threading.Thread(target=scribble, daemon=True).start()
        return self.out.clone()
