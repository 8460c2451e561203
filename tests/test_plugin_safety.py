"""Issue 60, backends that misbehave toward the run rather than in their numbers: a built-in's
name taken by a --backend-file class, an os.chdir while the file is imported, a sys.exit() or a
KeyboardInterrupt from inside run(), an output on the wrong device. Each backend is a small
file written to tmp_path and loaded with --backend-file, through the real command."""
import json
import textwrap

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder

from .test_cli import TINY

cli = CliRunner()


def _plugin(tmp_path, body: str, name: str = "plugin.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _scenario(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_an_output_on_the_meta_device_is_named_as_such(tmp_path):
    plugin = _plugin(tmp_path, """
        import torch
        from attnbench.backends.sdpa import SdpaBackend

        class OnMeta(SdpaBackend):
            name = "on_meta"

            def run(self, plan):
                out = super().run(plan)
                return torch.empty(out.shape, dtype=out.dtype, device="meta")
        """)
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(_scenario(tmp_path)), "--out", str(out), "--backend-file", str(plugin), "-b", "on_meta",
                         "--save-tensors", str(tmp_path / "tensors"), "-q"])
    assert r.exit_code == 1, r.output
    rows = RunFolder.load(out).rows
    assert len(rows) == 2 and {row.status for row in rows} == {"mismatch"}, [(x.status, x.reason) for x in rows]
    assert {row.reason for row in rows} == {"output on the wrong device: meta, expected cpu"}


def test_a_plugin_may_not_take_a_builtin_name_set_or_inherited(tmp_path):
    scenario = _scenario(tmp_path)
    named = _plugin(tmp_path, """
        from attnbench.backends.sdpa import SdpaBackend

        class Mine(SdpaBackend):
            name = "sdpa"
        """, "named.py")
    inherited = _plugin(tmp_path, """
        from attnbench.backends.sdpa import SdpaBackend

        class Faster(SdpaBackend):
            pass
        """, "inherited.py")
    for plugin, how in ((named, "class Mine is named 'sdpa'"),
                        (inherited, "class Faster inherits the name 'sdpa' from SdpaBackend")):
        r = cli.invoke(app, ["run", str(scenario), "--out", str(tmp_path / plugin.stem), "--backend-file", str(plugin),
                             "-b", "sdpa", "-q"])
        text = r.output.replace("\n", "")
        assert r.exit_code == 2 and how in text and "reserved for the built-ins" in text, r.output
        assert 'name = "my-sdpa"' in text and not (tmp_path / plugin.stem).exists()
    # a file that imports a built-in to subclass it under a name of its own still loads, and sdpa stays sdpa
    own = _plugin(tmp_path, """
        from attnbench.backends.sdpa import SdpaBackend

        class Own(SdpaBackend):
            name = "sdpa-own"
        """, "own.py")
    out = tmp_path / "ok"
    r = cli.invoke(app, ["run", str(scenario), "--out", str(out), "--backend-file", str(own), "-b", "sdpa", "-b", "sdpa-own",
                         "-q"])
    assert r.exit_code == 0, r.output
    assert sorted(row.id.backend for row in RunFolder.load(out).rows) == ["sdpa", "sdpa", "sdpa-own", "sdpa-own"]


def test_a_plugin_that_changes_folder_when_imported_moves_nothing(tmp_path, monkeypatch):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    (here / "s.yaml").write_text(TINY)
    (there / "s.yaml").write_text(TINY.replace("name: tiny", "name: elsewhere"))
    plugin = _plugin(tmp_path, f"""
        import os
        from attnbench.backends.sdpa import SdpaBackend

        os.chdir({str(there)!r})

        class Moves(SdpaBackend):
            name = "moves"
        """)
    monkeypatch.chdir(here)
    r = cli.invoke(app, ["run", "s.yaml", "--out", "out", "--backend-file", str(plugin), "-b", "moves", "-q"])
    assert r.exit_code == 0, r.output
    assert "changed the working folder" in r.output and "set back to" in r.output
    assert not (there / "out").exists() and json.loads((here / "out" / "manifest.json").read_text())["scenario"] == "tiny"


def test_sys_exit_or_keyboardinterrupt_inside_run_is_that_backends_error_row(tmp_path):
    plugin = _plugin(tmp_path, """
        import sys
        from attnbench.backends.sdpa import SdpaBackend

        class Exits(SdpaBackend):
            name = "exits"

            def run(self, plan):
                sys.exit(3)

        class Interrupts(SdpaBackend):
            name = "interrupts"

            def run(self, plan):
                raise KeyboardInterrupt("the library gave up")
        """)
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(_scenario(tmp_path)), "--out", str(out), "--backend-file", str(plugin),
                         "-b", "exits", "-b", "sdpa", "-b", "interrupts", "-q"])
    assert r.exit_code == 1, r.output  # the run went on past both: a failed row, not a stop (3, or 130)
    rf = RunFolder.load(out)
    assert rf.manifest.status == "complete" and len(rf.rows) == 6
    by = {(row.id.case_id, row.id.backend): row for row in rf.rows}
    for case in ("page_size=4", "page_size=8"):
        assert by[case, "sdpa"].status == "ok"
        assert by[case, "exits"].status == "error" and "called sys.exit(3)" in by[case, "exits"].reason
        assert by[case, "interrupts"].status == "error" and "raised KeyboardInterrupt (the library gave up)" in \
            by[case, "interrupts"].reason
