"""``attnbench report``: the HTML of two real CPU runs of the quickstart, read structurally and
rendered in headless Chromium (Debian's ``chromium-headless-shell`` or ``chromium``; CI
installs it and sets ATTNBENCH_BROWSER_TEST=required, so there a missing browser fails)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app

cli = CliRunner()
RUN_ARGS = ["--device", "cpu", "-b", "reference", "-b", "sdpa", "--measure-ms", "5", "--warmup-ms", "1",
            "--set", "timing.rounds=6", "-q"]
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    runs = []
    for name in ("before", "after"):
        r = cli.invoke(app, ["run", "quickstart", *RUN_ARGS, "--out", str(root / name)])
        assert r.exit_code == 0, r.output
        runs.append(root / name)
    return runs


@pytest.fixture(scope="module")
def report(two_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    r = cli.invoke(app, ["report", *map(str, two_runs), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


class Page(HTMLParser):
    """Tables (id/attrs -> rows of cell texts), the charts, and what would load from elsewhere."""

    def __init__(self):
        super().__init__()
        self.tables, self.charts, self.external, self.body = [], [], [], {}
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "table":
            self.tables.append({"attrs": a, "head": [], "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append({"attrs": a, "cells": []})
        elif tag in ("td", "th"):
            self._cell = [tag, a, ""]
        elif tag == "svg":
            self.charts.append(a.get("data-chart"))
        if tag in ("script", "img", "link", "iframe") and (a.get("src") or a.get("href")):
            self.external.append((tag, a.get("src") or a.get("href")))

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[2] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            kind, a, text = self._cell
            t = self.tables[-1]
            if kind == "th" and len(t["rows"]) == 1 and not t["head"]:
                t["head_cells"] = t.get("head_cells", []) + [(a.get("data-col"), text)]
            t["rows"][-1]["cells"].append((text.strip(), a))
            self._cell = None


def parse(html: str) -> Page:
    p = Page()
    p.feed(html)
    return p


def run_table(p: Page) -> tuple[list[str], list[dict]]:
    t = next(t for t in p.tables if t["attrs"].get("id") == "runs")
    cols = [c[1].get("data-col") for c in t["rows"][0]["cells"]]
    return cols, [{"attrs": r["attrs"], **{c: cell for c, cell in zip(cols, r["cells"])}} for r in t["rows"][1:]]


@pytest.mark.slow
def test_report_holds_rows_comparison_charts_environment(report, two_runs):
    html = report.read_text()
    p = parse(html)
    cols, rows = run_table(p)
    assert {"status", "reason", "median_ms", "repro"} <= set(cols)
    assert len(rows) == 8  # 2 runs x 2 cases x 2 backends
    assert {r["run"][0] for r in rows} == {"before", "after"}
    assert all(r["status"][0] == "ok" and r["repro"][0].startswith("attnbench run") for r in rows)
    assert all(float(r["median_ms"][1]["data-v"]) > 0 for r in rows)
    compares = [t["attrs"].get("data-compare") for t in p.tables if "data-compare" in t["attrs"]]
    assert compares.count("runs") == 1 and compares.count("backends") == 2
    runs_cmp = next(t for t in p.tables if t["attrs"].get("data-compare") == "runs")
    ratios = [r["cells"][5][0] for r in runs_cmp["rows"][1:]]
    assert len(ratios) == 4 and all(re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\]", x) for x in ratios), ratios
    assert p.charts.count("bars") == 2 and p.charts.count("roofline") == 2
    # a measured ceiling is drawn: the bandwidth line when some row is memory-bound, else the
    # matmul rate (on a fresh CI machine every quickstart row can come out compute-bound)
    assert 'data-ceiling="memory"' in html or 'data-ceiling="compute"' in html
    assert "roofline (no ceilings)" not in html
    env = next(t for t in p.tables if t["attrs"].get("class") == "env")
    keys = {r["cells"][0][0]: r["cells"][1][0] for r in env["rows"]}
    assert keys["device"] and keys["option device"] == "cpu" and keys["scenario"] == "quickstart"
    assert p.external == [] and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_report_of_a_missing_folder_is_a_clear_message(tmp_path):
    r = cli.invoke(app, ["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and "not a run folder" in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------------------- the browser
def browser() -> str | None:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None and os.environ.get("ATTNBENCH_BROWSER_TEST") == "required":
        pytest.fail(f"ATTNBENCH_BROWSER_TEST=required but none of {', '.join(BROWSERS)} is on PATH")
    if found is None:
        pytest.skip("no headless Chromium here (apt-get install chromium-headless-shell)")
    return found


def chromium(exe: str, *args: str) -> str:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def sorted_dom(exe: str, report: Path, fragment: str) -> Page:
    p = parse(chromium(exe, "--dump-dom", report.as_uri() + fragment))
    assert p.body.get("data-selftest") == "done", p.body
    return p


@pytest.mark.slow
def test_report_in_chromium_sorts_filters_and_draws(report, tmp_path):
    exe = browser()
    static = [float(r["median_ms"][1]["data-v"]) for r in run_table(parse(report.read_text()))[1]]
    up = sorted_dom(exe, report, "#selftest-sort=median_ms,1")
    times = [float(r["median_ms"][1]["data-v"]) for r in run_table(up)[1]]
    assert times == sorted(static)
    assert up.body["data-drawn"].split().count("bars") == 2 and "roofline" in up.body["data-drawn"]
    down = sorted_dom(exe, report, "#selftest-sort=median_ms,2")
    assert [float(r["median_ms"][1]["data-v"]) for r in run_table(down)[1]] == sorted(static, reverse=True)
    by_backend = sorted_dom(exe, report, "#selftest-sort=backend,1;backend=sdpa")
    rows = run_table(by_backend)[1]
    assert [r["backend"][0] for r in rows] == ["reference"] * 4 + ["sdpa"] * 4
    hidden = ["display: none" in (r["attrs"].get("style") or "") for r in rows]
    assert hidden == [True] * 4 + [False] * 4
    shot = tmp_path / "report.png"
    chromium(exe, "--window-size=1300,2400", f"--screenshot={shot}", report.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.slow
@pytest.mark.parametrize("cache", [
    '{"k": {"device_name": "DEV", "matmul_tflops": {"float32": "fast"}}}',
    '{"k": {"device_name": "DEV", "matmul_tflops": 5}}',
    '[1, 2]',
], ids=["rate-a-string", "rates-not-a-mapping", "cache-a-list"])
def test_a_ceilings_cache_whose_rate_is_not_a_number_is_ignored_with_a_note(two_runs, tmp_path, monkeypatch, cache):
    """Issue 37 item 15: `report` and `plot` crashed (TypeError, AttributeError) on a ceilings
    cache whose matmul rate is not a number; the entry is ignored and the chart says so."""
    import json as _json

    device = _json.loads((two_runs[0] / "rows.jsonl").read_text().splitlines()[0])["device"]
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    (tmp_path / "ceilings.json").write_text(cache.replace("DEV", device))
    out = tmp_path / "r.html"
    r = cli.invoke(app, ["report", str(two_runs[0]), "-o", str(out)])
    assert r.exit_code == 0, r.output
    if cache.startswith("{"):
        assert "ignored" in out.read_text()
    r = cli.invoke(app, ["plot", str(two_runs[0]), "--x", "page_size", "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "plots" / "roofline.png").exists()


@pytest.fixture(scope="module")
def five_round_runs(tmp_path_factory):
    """Runs of 5 timing rounds: 'a' and 'b' of one scenario with other --set overrides, 'c' of another."""
    root = tmp_path_factory.mktemp("five")
    scen = root / "s.yaml"
    scen.write_text("name: small\nmodel: {num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float32}\n"
                    "batch: '2q1s20'\ntiming: {warmup_ms: 0.2, measure_ms: 1, rounds: 5}\n")
    other = root / "o.yaml"
    other.write_text(scen.read_text().replace("name: small", "name: other"))
    runs = {}
    for name, path, extra in (("a", scen, []), ("b", scen, ["--set", "batch=4q1s200"]), ("c", other, [])):
        r = cli.invoke(app, ["run", str(path), "-b", "sdpa", "-b", "reference", "--out", str(root / name), "-q", *extra])
        assert r.exit_code == 0, r.output
        runs[name] = root / name
    return runs


def _text(html_path: Path) -> str:
    import html
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", html_path.read_text())).split())


@pytest.mark.slow
def test_report_of_runs_of_different_scenarios_says_so(five_round_runs, tmp_path):
    """Issue 37 item 22: a report over two runs of other scenarios (by text or --set, or by name)
    compared them as if the code had changed ("regressed", 44x) or listed new/vanished cases,
    saying nothing of it."""
    runs = five_round_runs
    out = tmp_path / "r.html"
    assert cli.invoke(app, ["report", str(runs["a"]), str(runs["b"]), "-o", str(out)]).exit_code == 0
    text = _text(out)
    assert "b against a not compared: b's --set overrides ['batch=4q1s200'] differ from a's []" in text, text
    assert 'data-compare="runs"' not in out.read_text()  # no table of verdicts ("regressed", 44x)
    assert cli.invoke(app, ["report", str(runs["a"]), str(runs["c"]), "-o", str(out)]).exit_code == 0
    assert "not compared: they are runs of different scenarios ('small' and 'other')" in _text(out)


@pytest.mark.slow
def test_too_few_rounds_for_an_interval_say_so_not_0_to_inf(five_round_runs, tmp_path):
    """Issue 37 item 22: with 5 paired rounds the exact signed-rank test's smallest p is 2/32 =
    0.0625 > 0.05, so the 95% interval is unbounded: the report showed "[0.000, inf] unclear" for a
    19x gap between two backends."""
    out = tmp_path / "r.html"
    assert cli.invoke(app, ["report", str(five_round_runs["a"]), "-o", str(out)]).exit_code == 0
    text = _text(out)
    assert "[0.000, inf]" not in text and "unclear" not in text
    assert "[no interval: 5 paired rounds are too few at 95%]" in text and "too few rounds (set timing.rounds=10)" in text


class _CountedRows(list):
    """A run's rows that count how often they are walked through."""

    walks = 0

    def __iter__(self):
        self.walks += 1
        return super().__iter__()


def test_the_per_case_bars_walk_the_rows_once_not_once_per_case():
    """Issue 37 item 27: the per-case bars scanned every row once per case, so a report grew with the
    square of its rows (10k rows 5.7 s, 20k 16.8 s, 100k not done in 600 s). Structural: the rows of
    a run are walked a fixed number of times, whatever the number of cases."""
    from attnbench.analyze.report import RunData, bars_section
    from attnbench.store.manifest import Manifest
    from attnbench.store.row_parts import RowIdentity, RowTiming
    from attnbench.store.rows import Row

    rows = _CountedRows(Row(RowIdentity("s", f"context={i}", b),
                            timing=RowTiming(median_ms=1.0 + i, p20_ms=1.0, p80_ms=2.0 + i))
                        for i in range(300) for b in ("sdpa", "flex"))
    html = bars_section([RunData("a", Manifest(), rows)])
    assert html.count("<svg") == 300
    assert rows.walks <= 2, rows.walks
