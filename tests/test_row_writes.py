"""Issue 37 item 6: a row whose write fails partway (a full disk, `ulimit -f`) leaves no half line
in rows.jsonl and its error names the file. The write used to go through a buffered file: a
row shorter than the buffer failed in `flush`, the cleanup's `truncate` flushed the same failing
buffer first (so nothing was cut), and the error that escaped came from `close()`, naming no file."""
import subprocess
import sys

from attnbench.store.runfolder import RunFolder

ROOM_FOR_PART_OF_A_ROW = r"""
import resource, signal, sys
from pathlib import Path
from attnbench.store.row_parts import RowIdentity
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
rf = RunFolder(sys.argv[1])
rf.add(Row(RowIdentity("s", "c", "a"), status="skipped", reason="x"))
size = (Path(sys.argv[1]) / "rows.jsonl").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:  # a row of 1 KB, shorter than a write buffer: 40 bytes of it fit
    rf.add(Row(RowIdentity("s", "c", "b"), status="skipped", reason="y" * 1000))
except OSError as e:
    print(len(rf.rows), e.filename, e.strerror)
"""


def test_a_row_that_fits_partly_leaves_no_half_line_and_names_the_file(tmp_path):
    p = subprocess.run([sys.executable, "-c", ROOM_FOR_PART_OF_A_ROW, str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    kept, path, why = p.stdout.split(" ", 2)
    assert kept == "1" and path == str(tmp_path / "rows.jsonl") and "File too large" in why, p.stdout
    data = (tmp_path / "rows.jsonl").read_bytes()
    assert data.count(b"\n") == 1 and data.endswith(b"\n"), data[-60:]  # no half line left behind
    assert len(RunFolder.load(tmp_path).rows) == 1
