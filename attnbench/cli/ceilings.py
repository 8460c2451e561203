"""``attnbench ceilings``: the measured ceilings % of roofline divides by, kept per device and
dtype (``measure/ceilings.py``); ``--measure`` measures them again and replaces them."""
from __future__ import annotations

from typing import List, Optional

import typer

from attnbench.cli.app import UsageError, app, console, handle_errors


def _show(key: str, c) -> list[str]:
    mm = ", ".join(f"{d} {v:.3g}" for d, v in sorted(c.matmul_tflops.items())) or "-"
    when = ", ".join(f"{k} {v}" for k, v in sorted(c.measured_at.items())) or "-"
    return [key, f"{c.copy_tbps:.3g}", f"{c.read_tbps:.3g}", mm, when]


@app.command("ceilings")
@handle_errors
def ceilings_cmd(
    measure: bool = typer.Option(False, "--measure", help="measure this device's ceilings again and replace the kept ones"),
    device: Optional[str] = typer.Option(None, help="cpu | cuda | cuda:N (for --measure; default: cuda if present)"),
    dtype: Optional[List[str]] = typer.Option(None, "--dtype", help="matmul dtype to measure (repeat; default: those kept)"),
    threads: int = typer.Option(1, help="CPU intra-op threads (CPU ceilings are kept per thread count)"),
):
    """Show the kept ceilings (memory bandwidth in TB/s, matmul TFLOP/s per dtype), each
    measured once per device and dtype when a run first needed it; --measure re-measures."""
    from attnbench.analyze.fit import PROSE, Col, print_fitted
    from attnbench.cli.numbers import check_numbers
    from attnbench.measure import ceilings as cl

    check_numbers(threads=threads)
    if measure:
        import torch

        from attnbench.execute.device import resolve_device
        from attnbench.measure.timing import cpu_threads

        try:
            dev = resolve_device(device or "auto")
        except ValueError as e:
            raise UsageError(f"--device {device}: {e}") from None
        old = cl.kept_ceilings().get(cl.cache_key(dev, threads))
        names = list(dtype or (sorted(old.matmul_tflops) if old else ["bfloat16"]))
        bad = [d for d in names if not isinstance(getattr(torch, d, None), torch.dtype)]
        if bad:
            raise UsageError(f"--dtype {bad[0]}: not a torch dtype (e.g. bfloat16, float16, float32)")
        with cpu_threads(dev, threads):
            before, after = cl.remeasure(dev, names, threads)
        if before is not None:
            console.print(f"before: copy {before.copy_tbps:.3g} TB/s, read {before.read_tbps:.3g} TB/s, matmul "
                          + ", ".join(f"{d} {v:.3g}" for d, v in sorted(before.matmul_tflops.items())), highlight=False)
    kept = cl.kept_ceilings()
    cols = [Col("device | torch | method", PROSE), Col("copy TB/s", justify="right"),
            Col("read TB/s", justify="right"), Col("matmul TFLOP/s", PROSE), Col("measured (UTC)", PROSE, drop=0)]
    if kept:
        print_fitted(console, cols, [_show(key, c) for key, c in kept.items()], f"ceilings kept in {cl.cache_path()}",
                     where=str(cl.cache_path()))
    else:
        console.print(f"no ceilings kept yet in {cl.cache_path()}: a run measures them when it needs them",
                      highlight=False, markup=False, soft_wrap=True)
    console.print(f"how: {cl.METHOD_TEXT}", style="dim", highlight=False)
