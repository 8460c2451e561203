"""Compile the triton backend's kernels for sm_90 without a GPU, and tell whether two checkouts generate the
same code: the check a refactoring of the kernels (a flag removed, a helper moved) passes before any GPU time.

    python3 scripts/dev/kernel_ptx.py dump REPO OUT [--routes gluon-tree,paged,...]
    python3 scripts/dev/kernel_ptx.py compare OLD_OUT NEW_OUT

``dump`` imports attnbench from REPO, builds one CPU batch per case below, plans it on the case's route (the
Gluon routes' Hopper check answered yes) and runs the route's launch with every kernel compiled and not
launched: Triton's driver is replaced by one that names an sm_90 target and launches nothing, so the compiler
runs its whole pipeline down to PTX (and ptxas) on this machine. Each compiled kernel's PTX goes to
OUT/CASE-N-KERNEL.ptx, its line records (``.loc``, ``.file``) dropped. ``compare`` cuts the debug sections
(DWARF: line numbers) and prints, per kernel: ``same`` (identical code), ``same-mod-params`` (identical but
for the numbering of its parameters, by one order-preserving map: what removing arguments the kernel never
read gives) or ``DIFFERENT``; exit 1 on any difference or missing kernel.

The Gluon kernels compile with the triton they are written for (3.6, the GPU machine's: docs/kernels.md);
put one first on PYTHONPATH (``pip install --no-deps --target DIR triton==3.6.0``). A newer triton fails
them at compile time, and ``dump`` says so per case. Run both dumps with the same triton.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def install_driver() -> None:
    """Triton's active driver: an sm_90 target on device 0, stream 0, that launches nothing."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime import driver

    class CompileOnly(DriverBase):
        def __init__(self):
            pass

        @staticmethod
        def is_active():
            return True

        def map_python_to_cpp_type(self, ty):
            return ty

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def set_current_device(self, device):
            pass

        def get_device_interface(self):
            return torch.cuda

        def get_benchmarker(self):
            return None

        def get_empty_cache_for_benchmark(self):
            return None

        def clear_cache(self, cache):
            pass

    driver.set_active(CompileOnly())


def cases():
    """name -> (BatchSpec, route, splits): every route, 16-bit and FP8 caches, head dims 64/128, small and
    large pages, and forced splits (the merge kernel)."""
    from attnbench.workload.spec import BatchSpec, Request
    from attnbench.workload.trees import chain, parse_tree

    shape = tuple(parse_tree({"choices": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}))

    def tree(ctx):
        return Request("tree", len(shape), ctx, shape)

    def decodes(*ctx):
        return tuple(Request("decode", 1, c) for c in ctx)

    mla = dict(attention="mla", kv_lora_rank=512, rope_dim=64)
    return {
        "tree-bf16-p16": (BatchSpec((tree(300), tree(1000), Request("decode", 1, 500)), 32, 8, 128, "bfloat16", 16),
                          "gluon-tree", None),
        "tree-f16-p64-d64": (BatchSpec((tree(300), Request("tree", 4, 200, tuple(chain(4)))), 16, 2, 64, "float16",
                                       64), "gluon-tree", None),
        "tree-fp8-p16": (BatchSpec((tree(300), tree(1000)), 32, 8, 128, "bfloat16", 16, kv_dtype="fp8_e4m3"),
                         "gluon-tree", None),
        "tree-e5m2-p256-ph": (BatchSpec((tree(300), tree(1000)), 32, 8, 128, "bfloat16", 256, kv_dtype="fp8_e5m2",
                                        kv_scale="per-head"), "gluon-tree", None),
        "tree-bf16-split": (BatchSpec((tree(3000), tree(1000)), 32, 8, 128, "bfloat16", 16), "gluon-tree", 2),
        "decode-bf16-p16": (BatchSpec(decodes(3000, 5000, 77), 32, 8, 128, "bfloat16", 16), "gluon-decode", None),
        "decode-fp8-p64": (BatchSpec(decodes(3000, 5000, 77), 32, 8, 128, "bfloat16", 64, kv_dtype="fp8_e4m3"),
                           "gluon-decode", None),
        "decode-d64-p16": (BatchSpec(decodes(3000, 77), 16, 4, 64, "float16", 16), "gluon-decode", None),
        "decode-bf16-split": (BatchSpec(decodes(3000, 5000), 32, 8, 128, "bfloat16", 16), "gluon-decode", 2),
        "prefill-bf16-p256": (BatchSpec((Request("prefill", 300, 1000), Request("prefill", 200, 0)), 32, 8, 128,
                                        "bfloat16", 256), "gluon-prefill", None),
        "prefill-f16-p64-d64": (BatchSpec((Request("prefill", 300, 1000), Request("prefill", 64, 33)), 32, 8, 64,
                                          "float16", 64), "gluon-prefill", None),
        "mla-bf16-128h": (BatchSpec(decodes(3000, 700), 128, 1, 576, "bfloat16", 64, **mla), "gluon-mla", None),
        "mla-f16-16h-p16": (BatchSpec(decodes(3000, 700), 16, 1, 576, "float16", 16, **mla), "gluon-mla", None),
        "mla-triton": (BatchSpec(decodes(3000, 700), 16, 1, 576, "float16", 16, **mla), "mla", None),
        "paged-f16": (BatchSpec((tree(300), Request("decode", 1, 500)), 32, 8, 128, "float16", 16), "paged", None),
        "paged-split": (BatchSpec((tree(3000), Request("decode", 1, 5000)), 32, 8, 128, "float16", 16), "paged", 2),
        "prefill-triton": (BatchSpec((Request("prefill", 300, 1000), Request("prefill", 64, 33)), 32, 8, 128,
                                     "float16", 16), "prefill", None),
    }


def dump(repo: Path, out: Path, routes: set[str]) -> int:
    sys.path.insert(0, str(repo))
    install_driver()
    import torch
    from triton.runtime.jit import JITFunction

    import attnbench
    if not Path(attnbench.__file__).resolve().is_relative_to(repo.resolve()):
        raise SystemExit(f"kernel_ptx.py: attnbench came from {attnbench.__file__}, not {repo}")
    from attnbench.backends.triton import TritonBackend
    from attnbench.kernels.decode import gluon as dg
    from attnbench.kernels.mla import gluon as mg
    from attnbench.kernels.prefill import gluon as pg
    from attnbench.kernels.tree import gluon as tg
    from attnbench.workload.batch import materialize

    for m in (dg, mg, pg, tg):
        m.hopper = lambda device: True  # the routes' device check: this is "an sm_90 GPU"
    torch.cuda.is_current_stream_capturing = lambda: False  # (asked by a launch; no CUDA here)
    compiled: list = []
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kw):
        kernel = run(self, *args, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, kernel.asm["ptx"]))
        return kernel

    JITFunction.run = compile_only
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, (spec, route, splits) in cases().items():
        if routes and route not in routes:
            continue
        compiled.clear()
        be = TritonBackend(route=route, splits=splits)
        batch = materialize(spec, seed=3, device="cpu")
        opts = be.settings()
        why = routes_refusals(be, batch, opts)
        try:
            if why:
                raise RuntimeError("; ".join(why))
            be.run(be.plan(batch))
        except Exception as e:  # noqa: BLE001 - a case that does not compile is reported, the others go on
            root = e
            while root.__cause__ is not None:
                root = root.__cause__
            print(f"{name}: FAILED ({route}): {type(root).__name__}: {str(root).splitlines()[-1] if str(root) else ''}")
            failed += 1
            continue
        for i, (kernel, ptx) in enumerate(compiled):
            ptx = re.sub(r"^\s*\.(loc|file)\b.*\n", "", ptx, flags=re.M)
            (out / f"{name}-{i}-{kernel}.ptx").write_text(ptx)
        print(f"{name}: {route}: " + ", ".join(k for k, _ in compiled))
    return 1 if failed else 0


def routes_refusals(be, batch, opts) -> list[str]:
    """The route's own reasons (the device and interpreter rules of ``unsupported`` are not this tool's)."""
    return be._route(batch, opts).refusals(batch, opts)


def code(text: str) -> str:
    """The PTX without its debug sections and blank lines."""
    m = re.search(r"^\s*\.section\s+\.debug", text, flags=re.M)
    text = text[: m.start()] if m else text
    return "\n".join(line for line in text.splitlines() if line.strip())


def same_but_params(a: str, b: str) -> dict | None:
    """The parameter renumbering that makes ``a`` into ``b`` (old index -> new), where one order-preserving
    injective map does and the code is otherwise identical; else None."""
    def split(t):
        body = "\n".join(line for line in t.splitlines() if not re.match(r"\s*\.param\b", line))
        return re.sub(r"_param_\d+", "_param_N", body), [int(x) for x in re.findall(r"_param_(\d+)", body)]

    (ta, ia), (tb, ib) = split(a), split(b)
    if ta != tb or len(ia) != len(ib):
        return None
    m: dict = {}
    if any(m.setdefault(x, y) != y for x, y in zip(ia, ib)):
        return None
    pairs = sorted(m.items())
    if any(p[1] >= q[1] for p, q in zip(pairs, pairs[1:])):
        return None
    return m


def compare(old: Path, new: Path) -> int:
    bad = 0
    names = sorted({p.name for p in old.glob("*.ptx")} | {p.name for p in new.glob("*.ptx")})
    if not names:
        print(f"kernel_ptx.py: no .ptx files in {old} or {new}")
        return 1
    for n in names:
        a, b = old / n, new / n
        if not (a.exists() and b.exists()):
            print(f"MISSING          {n} (only in {old if a.exists() else new})")
            bad += 1
            continue
        ca, cb = code(a.read_text()), code(b.read_text())
        if ca == cb:
            print(f"same             {n}")
            continue
        m = same_but_params(ca, cb)
        if m is None:
            print(f"DIFFERENT        {n}")
            bad += 1
        else:
            moved = ", ".join(f"{x}->{y}" for x, y in sorted(m.items()) if x != y)
            print(f"same-mod-params  {n} (parameters read, renumbered: {moved})")
    print(f"{len(names)} kernels, {bad} different or missing")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="compile every case's kernels for sm_90 and write their PTX")
    d.add_argument("repo", type=Path, help="the checkout whose attnbench is compiled")
    d.add_argument("out", type=Path)
    d.add_argument("--routes", default="", help="only these routes (comma-separated)")
    c = sub.add_parser("compare", help="compare two dump folders")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "dump":
        return dump(a.repo, a.out, {r for r in a.routes.split(",") if r})
    return compare(a.old, a.new)


if __name__ == "__main__":
    raise SystemExit(main())
