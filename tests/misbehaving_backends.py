"""Backends that misbehave on purpose (used with --backend-file by tests/test_isolation.py).

Not collected by pytest (no test_ prefix). Each one fails in one way: raises, segfaults
(a null read through ctypes), aborts, returns NaN, a wrong shape, a wrong dtype, hangs
(past --timeout), returns memory it never wrote, sleeps in `unsupported` (for the
kill-and-resume test), or skips with a blank reason (a malformed row).
"""
import ctypes, os, time
import torch
from attnbench.backend import Backend

class _Good(Backend):
    name = "_good_base"
    def plan(self, batch):
        from attnbench.workload.reference import reference_attention
        self.out = reference_attention(batch)[0].to(batch.dtype)
        return batch
    def run(self, batch):
        return self.out.clone()

class Explodes(Backend):
    name = "explodes"
    def plan(self, batch): return batch
    def run(self, batch): raise RuntimeError("kernel exploded")

class Segfault(Backend):
    name = "segfault"
    def plan(self, batch): return batch
    def run(self, batch): ctypes.string_at(0)

class Aborts(Backend):
    name = "aborts"
    def plan(self, batch): return batch
    def run(self, batch): os.abort()

class Nan(_Good):
    name = "nan"
    def run(self, batch):
        o = self.out.clone(); o[0, 0, 0] = float("nan"); return o

class Shape(_Good):
    name = "shape"
    def run(self, batch): return self.out[:-1].clone()

class Dtype(_Good):
    name = "dtype"
    def run(self, batch): return self.out.double()

class Sleeps(Backend):
    name = "sleeps"
    def plan(self, batch): return batch
    def run(self, batch): time.sleep(600)

class Unwritten(Backend):
    name = "unwritten"
    def plan(self, batch): return batch
    def run(self, batch): return torch.empty_like(batch.q)


class Sleepy(Backend):
    name = "sleepy"
    def unsupported(self, batch):  # a signal test that must land mid-run sets a longer sleep
        time.sleep(float(os.environ.get("ATTNBENCH_TEST_SLEEPY_S", "0.4")))
        return ["sleepy never runs"]
    def plan(self, batch): return batch
    def run(self, plan): return None


class Blank(_Good):
    name = "blank"
    def unsupported(self, batch): return [" "]  # skips without saying why: a malformed row


class RaisesLate(_Good):
    """Passes the first checked call, then raises on its 4th call (inside timing)."""
    name = "raises_late"
    calls = 0
    def run(self, batch):
        type(self).calls += 1
        if type(self).calls == 4:
            raise RuntimeError("illegal memory access on call 4")
        return self.out.clone()


class WrongSometimes(_Good):
    """Right on the checked calls, wrong (one request's rows zeroed) on every 50th call: 2%."""
    name = "wrong_2pct"
    calls = 0
    def run(self, batch):
        type(self).calls += 1
        o = self.out.clone()
        if type(self).calls % 50 == 7:
            o[: max(1, o.shape[0] // 4)] = 0
        return o


class Prints(_Good):
    """Chats on stdout, from Python and from the C level."""
    name = "prints"
    def run(self, batch):
        print("hello from the backend")
        os.write(1, b"raw bytes on fd 1\n")
        return self.out.clone()


class ExitsZero(_Good):
    """Ends the whole process with status 0 in the middle of a run (no cleanup runs)."""
    name = "exits0"
    def run(self, batch):
        os._exit(0)
