"""Command ``backends``: which backends can run here, and which a default run takes.

Without ``--probe`` it imports nothing heavy (no torch, no GPU library): built-in backends are
described from ``backend.builtin.BUILTIN_INFO``, libraries found with ``find_spec``, versions read from
package metadata, and the device guessed from the NVIDIA driver. ``--probe`` imports torch and
every library to give the exact answer (a wheel built for another torch fails only at import).
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
from pathlib import Path
from typing import List, Optional

import typer

from attnbench.backend import registry
from attnbench.backend.reasons import device_reason
from attnbench.cli.app import app, console, handle_errors, load_backend_files


def guess_device_type() -> str:
    """``cuda`` when an NVIDIA driver is loaded and CUDA_VISIBLE_DEVICES does not hide every
    GPU, else ``cpu`` (without importing torch; ``--probe`` asks torch)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return "cpu"
    return "cuda" if os.path.exists("/proc/driver/nvidia/version") else "cpu"


def _version(dist: str) -> str:
    try:
        return f"{dist} {md.version(dist)}"
    except md.PackageNotFoundError:
        return dist


def _found(lib: str, dist: Optional[str]) -> bool:
    """The library is installed. A subpackage (``flash_attn.cute``) is asked of its distribution's
    metadata: finding it would import its parent package (and torch with it)."""
    if "." in lib and dist:
        try:
            md.distribution(dist)
            return True
        except md.PackageNotFoundError:
            return False
    return importlib.util.find_spec(lib) is not None


def quick_status(name: str, device_type: str) -> tuple[str, str, str]:
    """(installed, default here, version or reason) of a built-in backend, found without
    importing it or its library."""
    info = registry.BUILTIN_INFO[name]
    lib = info.library or "torch"
    if not _found(lib, info.distribution):
        hint = f"; install with: {info.install_hint}" if info.install_hint else ""
        return "no", "no", f"{lib} not installed{hint}"
    version = _version(info.distribution or lib)
    why = device_reason(name, info.cuda_only, info.cpu_env, device_type)
    return "yes", "yes" if why is None else "no", version if why is None else f"{version}; {why}"


def probed_status(name: str, device_type: str) -> tuple[str, str, str]:
    """The same, from the backend class: imports it and its library."""
    try:
        cls = registry.get_backend_class(name)
        why = cls.unavailable()
        if why is not None:
            return "no", "no", why
        dev_why = cls.device_reason(device_type)
        return "yes", "yes" if dev_why is None else "no", cls.version() + (f"; {dev_why}" if dev_why else "")
    except Exception as e:
        return "no", "no", f"{type(e).__name__}: {e}"


def _status(name: str, device_type: str, probe: bool) -> tuple[str, str, str]:
    if not probe and name in registry.BUILTIN_INFO:
        return quick_status(name, device_type)
    if not probe and name not in registry.loaded_names():
        return "?", "?", "plugin (entry point): --probe imports it to check"
    return probed_status(name, device_type)


def _device(probe: bool) -> tuple[str, str]:
    if not probe:
        kind = guess_device_type()
        how = "an NVIDIA driver is loaded" if kind == "cuda" else "no NVIDIA driver found"
        return kind, f"device: {kind} ({how}; --probe asks torch)"
    from attnbench.execute.runner import resolve_device

    dev = resolve_device("auto")
    return dev.type, f"device: {dev} (torch)"


@app.command("backends")
@handle_errors
def list_backends(
    backend_file: Optional[List[Path]] = typer.Option(None, help="Python file defining Backend subclasses (RUNS it)"),
    probe: bool = typer.Option(
        False, "--probe", help="import torch and each library to check it really loads (slower)"
    ),
):
    """List the backends, whether each can run here, and which ones a run takes by default."""
    from attnbench.analyze.fit import NAME, PROSE, Col, print_fitted

    load_backend_files(backend_file)
    device_type, device_line = _device(probe)
    cols = [Col("backend", NAME), Col("installed"), Col("default"), Col("version / reason", PROSE)]
    print_fitted(console, cols, [[n, *_status(n, device_type, probe)] for n in registry.all_names()])
    console.print(
        f"{device_line}. default: what `attnbench run` takes without -b or a scenario's `backends:`; "
        "a backend named with -b always runs (or gives skipped rows saying why)",
        highlight=False, style="dim",
    )
    if probe:
        _print_options()
    else:
        console.print("options (-b NAME:key=value): --probe lists them", highlight=False, style="dim")


def _print_options() -> None:
    """Each backend's declared options (``-b NAME:key=value``), with defaults and env vars."""
    from attnbench.backend.options import describe_options

    for n in registry.all_names():
        try:
            lines = describe_options(dict(getattr(registry.get_backend_class(n), "options", {}) or {}), n)
        except Exception:
            continue
        for line in lines:
            console.print(f"  -b {n}:{line}", highlight=False, markup=False)
