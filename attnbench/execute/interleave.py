"""Two checkouts measured in turns: ``attnbench run`` of one scenario from each, one timing
round at a time, alternating (base, head, head, base, base, head, ...), so that a slow spell of
the machine falls on both sides alike.

Each side has a few worker processes (``Plan.workers``), started once: a worker imports its
checkout's attnbench and nothing else of attnbench (``worker_env``: Python starts with ``-S``, so
no ``.pth`` file installs an editable install's import hook, which answered for every module the
checkout lacks; ``sys.path`` is the checkout's root, then this interpreter's library folders) and
then runs ``attnbench run ...`` in-process each time it is told, through the command line's own
entry (the one contract every version of attnbench keeps), into a fresh run folder. Turn k goes
to worker ``k mod workers`` of its side: a process's own luck (memory placement, what its
allocator did before) is shared by only a share of a side's rounds, and no round pays the
seconds of a Python and torch start-up. The interpreter and the installed libraries are the
same for both sides: what differs is attnbench's code, and nothing else.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from attnbench.execute.checkouts import Checkout


class InterleaveError(RuntimeError):
    """A side that could not run the scenario; the message names the side and what it said."""


@dataclass
class Plan:
    scenario: Path  # the one scenario file both sides run (a copy, so both read the same text)
    turns: int  # runs per side
    rounds_per_turn: int  # timing rounds in each run
    workers: int = 4  # processes per side
    sets: Sequence[str] = ()
    backends: Sequence[str] = ()
    device: Optional[str] = None
    timeout_s: Optional[float] = None  # per run


@dataclass
class Turn:
    side: str
    index: int  # 1-based, per side
    worker: int  # 1-based
    folder: Path
    seconds: float = 0.0


@dataclass
class Result:
    folders: dict = field(default_factory=dict)  # side name -> [run folder per turn, in order]
    turns: list = field(default_factory=list)


def order(turns: int) -> list[tuple[int, int]]:
    """(turn, side index) in the order they run: ABBA, so neither side always goes first."""
    out = []
    for b in range(turns):
        sides = (0, 1) if b % 2 == 0 else (1, 0)
        out += [(b, s) for s in sides]
    return out


def run_command(scenario: Path, folder: Path, sets: Sequence[str], backends: Sequence[str],
                device: Optional[str]) -> list[str]:
    """The ``attnbench`` arguments of one quiet ``run`` into ``folder`` (``calibrate``'s runs too)."""
    args = ["run", str(scenario), "--out", str(folder), "-q"]
    for s in sets:
        args += ["--set", s]
    for b in backends:
        args += ["-b", b]
    if device:
        args += ["--device", device]
    return args


def run_args(plan: Plan, folder: Path) -> list[str]:
    """The ``attnbench`` arguments of one turn."""
    return run_command(plan.scenario, folder, [f"timing.rounds={plan.rounds_per_turn}", *plan.sets],
                       plan.backends, plan.device)


# What a worker runs: written next to the run folders, executed with the checkout on PYTHONPATH.
# It answers one JSON line per request on its original stdout; everything attnbench prints goes
# to the worker's log file. Only `attnbench.cli.app` is imported from the checkout.
WORKER = r'''
import json, os, sys
proto = os.fdopen(os.dup(1), "w", buffering=1)
log = open(sys.argv[1], "a", buffering=1)
os.dup2(log.fileno(), 1)
os.dup2(log.fileno(), 2)
def answer(**kw):
    proto.write(json.dumps(kw) + "\n")
try:
    import attnbench
    root = os.path.realpath(sys.argv[2])
    if not os.path.realpath(attnbench.__file__).startswith(root + os.sep):
        raise ImportError(f"attnbench came from {attnbench.__file__}, not from the checkout {root}")
    from attnbench.cli import app
    from typer.main import get_command
    import click
    command = get_command(app)
except BaseException as e:
    answer(ready=False, error=f"{type(e).__name__}: {e}")
    sys.exit(1)
answer(ready=True, module=attnbench.__file__)
for line in sys.stdin:
    args = json.loads(line)
    print(f"--- attnbench {' '.join(args)}", flush=True)
    try:
        # standalone_mode=False returns a typer.Exit's code instead of raising it
        code = command.main(args=args, prog_name="attnbench", standalone_mode=False)
        code = code if isinstance(code, int) and not isinstance(code, bool) else 0
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except click.exceptions.Abort:
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        import traceback
        traceback.print_exc()
        code = 99
    sys.stdout.flush(); sys.stderr.flush()
    answer(exit=code)
'''


def worker_env(root: Path) -> dict:
    """The environment of a worker of checkout ``root`` (started with ``python -S``): its
    ``PYTHONPATH`` is ``root``, then this interpreter's library folders (site-packages: torch,
    typer). No ``.pth`` file runs, so no import hook is installed; ``attnbench`` is found in
    ``root`` first, and its modules only in its own folder (an installed attnbench further on
    the path lends none)."""
    paths = [str(root)] + [p for p in sys.path if p and os.path.exists(p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


class Worker:
    """One process of one side, running ``attnbench run`` in-process on request."""

    def __init__(self, co: Checkout, index: int, work: Path):
        self.co, self.index = co, index
        self.log = work / f"{co.name}-worker-{index}.log"
        script = work / "worker.py"
        if not script.is_file():
            script.write_text(WORKER)
        self.proc = subprocess.Popen([sys.executable, "-S", str(script), str(self.log), str(co.root)], cwd=co.root,
                                     env=worker_env(co.root), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def _answer(self, what: str, timeout_s: Optional[float] = None) -> dict:
        if timeout_s:
            import select
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
            if not ready:
                self.close(kill=True)
                raise InterleaveError(f"{self.co.name} {self.co.label}: worker {self.index} gave no answer within "
                                      f"{timeout_s:g} s (--timeout) during {what}: {self.tail()}")
        line = self.proc.stdout.readline()
        if not line:
            raise InterleaveError(f"{self.co.name} {self.co.label}: worker {self.index} ended during {what} "
                                  f"(exit {self.proc.poll()}): {self.tail()}")
        return json.loads(line)

    def ready(self, timeout_s: Optional[float] = None) -> None:
        """Wait for the worker's start-up answer (its attnbench imported), at most ``timeout_s``."""
        a = self._answer("start-up (importing its attnbench)", timeout_s)
        if not a.get("ready"):
            raise InterleaveError(f"{self.co.name} {self.co.label}: cannot import its attnbench: {a.get('error')}")

    def run(self, args: list[str], timeout_s: Optional[float]) -> int:
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        return int(self._answer("a run", timeout_s).get("exit", 99))

    def tail(self, lines: int = 4) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:])

    def close(self, kill: bool = False) -> None:
        """End the worker: its input closed (it finishes what it runs), or ``kill``ed."""
        if self.proc.poll() is None:
            try:
                if kill:
                    raise OSError("stopped")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def run_interleaved(sides: Sequence[Checkout], plan: Plan, out: Path,
                    on_turn: Callable[[Turn, int, int], None] = lambda t, i, n: None) -> Result:
    """Every turn of both sides, alternating, into ``out/<side>/turn-NN``."""
    if len(sides) != 2:
        raise ValueError("two sides: base and head")
    out.mkdir(parents=True, exist_ok=True)
    workers = [[Worker(co, w + 1, out) for w in range(plan.workers)] for co in sides]
    failed = True  # a side that failed or hangs, or a stop: its workers are killed, not waited for
    try:
        for ws in workers:
            for w in ws:
                w.ready(plan.timeout_s)
        res = Result(folders={co.name: [None] * plan.turns for co in sides})
        seq = order(plan.turns)
        for i, (b, s) in enumerate(seq, 1):
            co, w = sides[s], workers[s][b % plan.workers]
            folder = out / co.name / f"turn-{b + 1:02d}"
            t0 = time.perf_counter()
            code = w.run(run_args(plan, folder), plan.timeout_s)
            # 1: some row error/mismatch (the check reports it as broken); else no usable run
            if code not in (0, 1) or not (folder / "rows.jsonl").is_file():
                raise InterleaveError(f"{co.name} {co.label} could not run the scenario (exit {code}): {w.tail()}")
            turn = Turn(co.name, b + 1, w.index, folder, time.perf_counter() - t0)
            res.folders[co.name][b] = folder
            res.turns.append(turn)
            on_turn(turn, i, len(seq))
        failed = False
        return res
    finally:
        for ws in workers:
            for w in ws:
                w.close(kill=failed)
