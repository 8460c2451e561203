"""Issue 60 E19: a run stopped by a full disk used to print `note: could not mark RUN incomplete:
[Errno 28] ...` although its manifest, written at the start, says incomplete. The write fails
here the way a full disk makes it fail: RLIMIT_FSIZE below the manifest's size."""
import json
import subprocess
import sys

MARK = """
import resource, signal, sys
from attnbench.cli.app import _finish_quietly
from attnbench.store.runfolder import RunFolder
rf = RunFolder.create(None, "s", sys.argv[1])
rf.start({"scenario": "s", "scenario_text": "x" * 20000})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
_finish_quietly(rf, complete=False)
print("marked")
"""


def test_a_failed_marking_says_nothing_when_the_manifest_says_incomplete(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", MARK, str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "marked" in p.stdout, p.stderr
    assert "could not mark" not in p.stderr, p.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"
    assert not [f for f in out.iterdir() if f.name.endswith(".tmp")]
