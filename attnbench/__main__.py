"""``python3 -m attnbench`` = the ``attnbench`` command."""
from .cli import app

app(prog_name="attnbench")
