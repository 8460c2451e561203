import os
import random

import pytest
import torch

# On a machine with a GPU, import triton compiled before any test module is collected: the
# interpreter tests import triton's kernels under TRITON_INTERPRET=1 at collection, and a triton
# first imported that way keeps its standard library interpreted for the whole process (in
# `pytest -m gpu` on an H100, flex's compiled kernels then failed to build). Those modules re-run
# themselves in a fresh process when triton was imported compiled before them.
if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    try:
        import triton.language  # noqa: F401
    except ImportError:
        pass

# pytest-xdist's workers start with COLUMNS=80 (a serial run has none): drop it so that every
# command a test runs sizes its tables as in the README's serial test command and in CI (160 where
# not a terminal); a test that wants a width passes COLUMNS itself.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("COLUMNS") == "80":
    del os.environ["COLUMNS"]
os.environ.setdefault("ATTNBENCH_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "attnbench"))

from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402


def make_batch(requests, *, hq=4, hkv=2, d=32, dtype="float32", page_size=4, layout="shuffled", seed=0, device="cpu",
               **variants):
    """A materialized batch; ``variants``: BatchSpec's window, sinks, softcap, alibi, kv_dtype, kv_scale, kv_order."""
    spec = BatchSpec(tuple(requests), hq, hkv, d, dtype, page_size, layout, **variants)
    return materialize(spec, seed, device)


@pytest.fixture
def mixed_requests():
    return [
        Request("decode", 1, 37),
        Request("prefill", 13, 20),
        Request("tree", 6, 11, (-1, 0, 0, 1, 1, 2)),
        Request("prefill", 5, 0),
        Request("decode", 1, 0),
    ]


def _order_seed() -> int | None:
    """``ATTNBENCH_TEST_ORDER``: ``random`` (a fresh seed) or a seed (to repeat an order); unset:
    the files' own order."""
    value = os.environ.get("ATTNBENCH_TEST_ORDER", "")
    if value == "random":
        value = os.environ["ATTNBENCH_TEST_ORDER"] = str(random.SystemRandom().randrange(10**6))  # xdist workers agree
    return int(value) if value.isdigit() else None


def pytest_configure(config):
    _order_seed()  # a "random" seed is drawn once, here, before pytest-xdist starts its workers


def pytest_report_header(config):
    seed = _order_seed()
    return [f"test order: shuffled, seed {seed} (ATTNBENCH_TEST_ORDER={seed} repeats it)"] if seed is not None else []


def pytest_terminal_summary(terminalreporter):
    seed = _order_seed()  # in the summary too: -q prints no header
    if seed is not None:
        terminalreporter.write_line(f"test order: shuffled, seed {seed} (ATTNBENCH_TEST_ORDER={seed} repeats it)")


def shuffled(items: list, seed: int) -> list:
    """The test files in a random order, and each file's tests in a random order (as
    pytest-randomly does: a file's module-scoped fixtures are still made once)."""
    rng = random.Random(seed)
    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    files = list(by_file.values())
    rng.shuffle(files)
    for tests in files:
        rng.shuffle(tests)
    return [item for tests in files for item in tests]


def pytest_collection_modifyitems(config, items):
    """``ATTNBENCH_TEST_ORDER`` (CI sets ``random``): every test must pass in any order.
    ``ATTNBENCH_FLASHINFER_LAST=1`` (the tests lane of scripts/gpu/validate.py): FlashInfer's tests after the
    others (a stable sort, the same order in every xdist worker), while its JIT warm-up builds
    their kernels in the background."""
    seed = _order_seed()
    if seed is not None:
        items[:] = shuffled(items, seed)
    if os.environ.get("ATTNBENCH_FLASHINFER_LAST") == "1":
        items.sort(key=lambda item: "flashinfer" in item.nodeid.lower())


def gpu_available() -> bool:
    return torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _gluon_api_as_on_the_gpu(monkeypatch):
    """Without a GPU, the tests that pretend a Hopper GPU (the routes' ``hopper`` patched) pretend one with the
    triton the Gluon kernels are written for: its Gluon API check says nothing. (The check itself, and the routes'
    refusals when it does say something: tests/test_triton_routes.py. On a GPU the installed triton answers.)"""
    if not gpu_available():
        from attnbench.kernels.shared import gluon as gluon_host  # (imports torch only, not triton)

        monkeypatch.setattr(gluon_host, "api_problem", lambda: "")


_EXIT = {}


def pytest_sessionfinish(session, exitstatus):
    _EXIT["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Once pytest has printed its summary, leave without the interpreter's teardown when
    triton was imported: its nanobind bindings hold objects Python does not free at exit and
    print a leak dump after the summary (harmless; it buried the passed/failed line)."""
    import sys

    if "triton" in sys.modules and "status" in _EXIT and not os.environ.get("ATTNBENCH_KEEP_TEARDOWN"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT["status"])


@pytest.fixture
def tiny(tmp_path):
    """test_cli's tiny CPU scenario (TINY) written to a file."""
    from .test_cli import TINY

    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    return p


def wait_rows(folder, n: int, limit: float = 120) -> None:
    """Wait until a run folder's rows.jsonl holds ``n`` rows (a run in a child process)."""
    import time
    from pathlib import Path

    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        f = Path(folder) / "rows.jsonl"
        if f.is_file() and len(f.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} rows in {folder} after {limit} s")
