"""``python3 -m attnbench`` = the ``attnbench`` command (run under its supervising process)."""
from attnbench.cli.supervise import main

main()
