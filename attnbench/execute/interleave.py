"""Two checkouts measured in turns: ``attnbench run`` of one scenario from each, alternating
(base, head, head, base, base, head, ...), each process a few timing rounds, so that a slow
spell of the machine falls on both sides and a process's own luck (memory placement, caches
warmed by what ran before) is one replicate among many rather than the whole of one side.

Each process runs with the checkout's root first on ``PYTHONPATH`` and as its working folder,
so ``python -m attnbench`` imports that checkout's code; the interpreter and the installed
libraries are the same for both sides (what is compared is attnbench's code, nothing else).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from attnbench.execute.checkouts import Checkout


class InterleaveError(RuntimeError):
    """A side's run that did not produce rows; the message names the side, block and output."""


@dataclass
class Plan:
    scenario: Path  # the one scenario file both sides run (a copy, so both read the same text)
    blocks: int  # processes per side
    rounds_per_block: int  # timing rounds in each process
    sets: Sequence[str] = ()
    backends: Sequence[str] = ()
    device: Optional[str] = None
    timeout_s: Optional[float] = None  # per process


@dataclass
class Turn:
    side: str
    block: int  # 1-based
    folder: Path
    seconds: float = 0.0


@dataclass
class Result:
    folders: dict = field(default_factory=dict)  # side name -> [run folder per block, in block order]
    turns: list = field(default_factory=list)


def order(blocks: int) -> list[tuple[int, int]]:
    """(block, side index) in the order they run: ABBA, so neither side always goes first."""
    out = []
    for b in range(blocks):
        sides = (0, 1) if b % 2 == 0 else (1, 0)
        out += [(b, s) for s in sides]
    return out


def command(co: Checkout, plan: Plan, folder: Path) -> list[str]:
    cmd = [sys.executable, "-m", "attnbench", "run", str(plan.scenario), "--out", str(folder), "-q",
           "--set", f"timing.rounds={plan.rounds_per_block}"]
    for s in plan.sets:
        cmd += ["--set", s]
    for b in plan.backends:
        cmd += ["-b", b]
    if plan.device:
        cmd += ["--device", plan.device]
    return cmd


def _env(co: Checkout) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(co.root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_turn(co: Checkout, plan: Plan, folder: Path) -> float:
    cmd = command(co, plan, folder)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=co.root, env=_env(co), capture_output=True, text=True, timeout=plan.timeout_s)
    except subprocess.TimeoutExpired:
        raise InterleaveError(f"{co.name} {co.label}: `attnbench run` ran past {plan.timeout_s:g} s "
                              f"(run folder {folder})") from None
    # 1: some row error/mismatch (the check reports it as broken); anything else: no usable run
    if proc.returncode not in (0, 1) or not (folder / "rows.jsonl").is_file():
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise InterleaveError(f"{co.name} {co.label} could not run the scenario (exit {proc.returncode}): {tail}")
    return time.perf_counter() - t0


def run_interleaved(sides: Sequence[Checkout], plan: Plan, out: Path,
                    on_turn: Callable[[Turn, int, int], None] = lambda t, i, n: None) -> Result:
    """Every block of both sides, in turns, into ``out/<side>/block-NN``."""
    if len(sides) != 2:
        raise ValueError("two sides: base and head")
    res = Result(folders={co.name: [None] * plan.blocks for co in sides})
    turns = order(plan.blocks)
    for i, (b, s) in enumerate(turns, 1):
        co = sides[s]
        folder = out / co.name / f"block-{b + 1:02d}"
        turn = Turn(co.name, b + 1, folder)
        turn.seconds = run_turn(co, plan, folder)
        res.folders[co.name][b] = folder
        res.turns.append(turn)
        on_turn(turn, i, len(turns))
    return res
