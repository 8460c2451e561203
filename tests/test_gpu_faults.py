"""GPU faults inside timed calls (run on the GPU machine: pytest -m gpu tests/test_gpu_faults.py).

A CUDA out-of-memory on a later call is the row's reason, with timing.rounds 1 and 3; a
device-side fault (an out-of-range gather: "device-side assert triggered", which leaves the
CUDA context unusable like an illegal address) under --isolate is an error row for that
backend, and the next backend still runs, in a fresh process."""
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder

from .test_cli import TINY

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FAULTY = textwrap.dedent('''
    import torch
    from attnbench.backend import Backend

    class _Good(Backend):
        name = "_gpu_good_base"
        calls = 0
        def plan(self, batch):
            from attnbench.workload.reference import reference_attention
            self.out = reference_attention(batch)[0].to(batch.dtype)
            return batch
        def run(self, batch):
            type(self).calls += 1
            if type(self).calls >= 4:
                self.fault(batch)
            return self.out.clone()

    class OomLate(_Good):
        name = "oom_late"
        capturable = False
        def fault(self, batch):
            torch.empty(1 << 50, dtype=torch.uint8, device=batch.q.device)  # 1 PiB

    class AssertLate(_Good):
        name = "assert_late"
        capturable = False
        def fault(self, batch):
            idx = torch.full((1,), 1 << 30, device=batch.q.device, dtype=torch.long)
            batch.q.view(-1)[idx].sum().item()
''')


@pytest.mark.parametrize("rounds", [1, 3])
def test_cuda_oom_while_timed_is_the_reason(tmp_path, rounds):
    f = tmp_path / "faulty.py"
    f.write_text(FAULTY)
    s = tmp_path / "t.yaml"
    s.write_text(TINY.replace("device: cpu", "device: cuda"))
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", str(s), "--out", str(out), "--backend-file", str(f), "-b", "oom_late", "-b", "sdpa",
                                 "--set", "sweep={}", "--set", f"timing.rounds={rounds}", "-q"])
    assert r.exit_code == 1, r.output
    rows = {x.id.backend: x for x in RunFolder.load(out).rows}
    assert rows["oom_late"].status == "error" and "out of memory" in rows["oom_late"].reason.lower()
    assert rows["sdpa"].status == "ok"


def test_device_side_fault_under_isolate_is_one_error_row(tmp_path):
    f = tmp_path / "faulty.py"
    f.write_text(FAULTY)
    s = tmp_path / "t.yaml"
    s.write_text(TINY.replace("device: cpu", "device: cuda"))
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", str(s), "--out", str(out), "--backend-file", str(f), "-b", "assert_late", "-b", "sdpa",
                                 "--set", "sweep={}", "--isolate", "--timeout", "120", "-q"])
    assert r.exit_code == 1, r.output
    rows = {x.id.backend: x for x in RunFolder.load(out).rows}
    assert rows["assert_late"].status == "error" and "CUDA" in rows["assert_late"].reason
    assert rows["sdpa"].status == "ok"
