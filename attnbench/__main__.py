"""``python3 -m attnbench`` = the ``attnbench`` command."""
from attnbench.cli import app

app(prog_name="attnbench")
