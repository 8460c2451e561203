"""--isolate after a device-side fault (issue 24 item 10): the child that saw a CUDA error
sends its row, says "restart" and exits 0 on purpose; the parent must start a fresh child
for the backends left, not blame them with "child process exited with code 0" (what the
GPU tests test_device_side_fault_under_isolate_is_one_error_row and
test_isolate_in_rounds_blames_the_kernel_that_faulted saw on an H100).

The child's side needs a CUDA context to poison; the parent's side is tested here on the CPU
with scripted children that send what a real child sends."""
from __future__ import annotations

import pytest

from attnbench.execute import isolate
from attnbench.execute.job import Job
from attnbench.execute.options import RunOptions
from attnbench.execute.runner import Runner
from attnbench.store.rows import Row, Status
from attnbench.workload.scenario import load_text

from .test_cli import TINY


class _Proc:
    def __init__(self, rc: int):
        self.rc = rc

    def wait(self):
        return self.rc

    def poll(self):
        return self.rc


class _ScriptedChild:
    """Plays back the events of one child, then the end of its stream and its exit code."""

    scripts: list = []
    started: list = []

    def __init__(self, job: Job):
        events, rc = type(self).scripts.pop(0)
        type(self).started.append(list(job.backends))
        self.events = list(events)
        self.proc = _Proc(rc)

    def next_event(self, deadline):
        return self.events.pop(0) if self.events else None

    def kill(self):
        pass

    def close(self):
        pass

    def exit_text(self):
        return f"exited with code {self.proc.rc}"

    def stderr_tail(self, max_chars=400):
        return ""


def _row(runner, case, backend: str, status: str, reason: str = "") -> dict:
    row = runner.base_row(case, case.scenario.batch_spec(), backend)
    row.status, row.reason = Status(status), reason
    if row.status is Status.OK:  # a well-formed ok row (store.rows.checked)
        row.timing.samples_ms, row.timing.round_medians_ms, row.timing.median_ms, row.timing.n, row.timing.timing_method = [1.0], [1.0], 1.0, 1, "cpu"
    return row.to_json()


@pytest.fixture
def runner():
    sf = load_text(TINY, "tiny.yaml", ["sweep={}"])
    return Runner(sf, RunOptions(backends=["flex", "sdpa", "reference"]))


def test_a_child_restarting_after_a_cuda_error_blames_no_one_else(monkeypatch, runner):
    case = runner.sf.cases[0]
    fault = _row(runner, case, "flex", "error", "RuntimeError: CUDA error: device-side assert triggered")
    # what the child sends with timing.rounds 1 and N alike: the failed step's end, its row, restart
    first = [{"event": "ready"}, {"event": "start", "backend": "flex"}, {"event": "end", "backend": "flex"},
             {"event": "row", "row": fault}, {"event": "restart"}]
    second = [{"event": "ready"}]
    for b in ("sdpa", "reference"):
        second += [{"event": "start", "backend": b}, {"event": "end", "backend": b},
                   {"event": "row", "row": _row(runner, case, b, "ok")}]
    second.append({"event": "done"})
    monkeypatch.setattr(_ScriptedChild, "scripts", [(first, 0), (second, 0)])
    monkeypatch.setattr(_ScriptedChild, "started", [])
    monkeypatch.setattr(isolate, "_Child", _ScriptedChild)
    rows = list(isolate.isolated_rows(runner, Job(TINY, "tiny.yaml", ["sweep={}"], runner.opts), timeout=60))
    by = {r.id.backend: r for r in rows}
    assert by["flex"].status == "error" and "device-side assert" in by["flex"].reason
    assert by["sdpa"].status == "ok" and by["reference"].status == "ok", [(r.id.backend, r.reason) for r in rows]
    assert _ScriptedChild.started == [["flex", "sdpa", "reference"], ["sdpa", "reference"]]


def test_a_child_dying_with_code_0_without_restart_is_still_an_error(monkeypatch, runner):
    """Exit 0 without saying "restart" (a backend calling os._exit(0)) is blamed on the
    backend whose step was running, as before."""
    case = runner.sf.cases[0]
    first = [{"event": "ready"}, {"event": "start", "backend": "flex"}]
    second = [{"event": "ready"}]
    for b in ("sdpa", "reference"):
        second += [{"event": "row", "row": _row(runner, case, b, "ok")}]
    monkeypatch.setattr(_ScriptedChild, "scripts", [(first, 0), (second, 0)])
    monkeypatch.setattr(_ScriptedChild, "started", [])
    monkeypatch.setattr(isolate, "_Child", _ScriptedChild)
    rows = list(isolate.isolated_rows(runner, Job(TINY, "tiny.yaml", ["sweep={}"], runner.opts), timeout=60))
    by = {r.id.backend: r for r in rows}
    assert by["flex"].status == "error" and "exited with code 0" in by["flex"].reason
    assert by["sdpa"].status == "ok" and by["reference"].status == "ok"
    assert isinstance(rows[0], Row)


def test_a_child_dying_after_a_backends_steps_blames_that_backend(monkeypatch, runner):
    """A fault reported after a backend's last step ended, before its row was sent (freeing its
    memory synchronizes a faulted CUDA context): that backend is blamed, the ones after it,
    which never ran, go to a fresh child."""
    case = runner.sf.cases[0]
    first = [{"event": "ready"}, {"event": "start", "backend": "flex"}, {"event": "end", "backend": "flex"}]
    second = [{"event": "ready"}]
    for b in ("sdpa", "reference"):
        second += [{"event": "row", "row": _row(runner, case, b, "ok")}]
    monkeypatch.setattr(_ScriptedChild, "scripts", [(first, 1), (second, 0)])
    monkeypatch.setattr(_ScriptedChild, "started", [])
    monkeypatch.setattr(isolate, "_Child", _ScriptedChild)
    rows = list(isolate.isolated_rows(runner, Job(TINY, "tiny.yaml", ["sweep={}"], runner.opts), timeout=60))
    by = {r.id.backend: r for r in rows}
    assert by["flex"].status == "error" and "exited with code 1" in by["flex"].reason
    assert by["sdpa"].status == "ok" and by["reference"].status == "ok"
    assert _ScriptedChild.started == [["flex", "sdpa", "reference"], ["sdpa", "reference"]]


def test_releasing_a_faulted_cuda_context_does_not_lose_the_row(monkeypatch):
    """The runner frees memory (gc, synchronize, empty_cache) before it yields each row; on a
    context a backend faulted, synchronize raises: the row that faulted must still come out."""
    from attnbench.execute import runner as runner_mod

    def faulted(*a, **k):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(runner_mod.torch.cuda, "synchronize", faulted)
    runner_mod._release(runner_mod.torch.device("cuda"))  # no exception
