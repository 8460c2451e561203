"""Backends that take their whole process down (used with --backend-file by tests/test_dask.py).

Not collected by pytest (no test_ prefix). Under --executor dask the process is a Dask
worker: `exits` ends it with os._exit (no exception, no cleanup), `sigkills` sends itself
SIGKILL (as the OOM killer would). Both die inside `run`, after plan() succeeded.
"""
import os
import signal

from attnbench.backend import Backend


class Exits(Backend):
    name = "exits"

    def plan(self, batch):
        return batch

    def run(self, batch):
        os._exit(3)


class SigKills(Backend):
    name = "sigkills"

    def plan(self, batch):
        return batch

    def run(self, batch):
        os.kill(os.getpid(), signal.SIGKILL)
