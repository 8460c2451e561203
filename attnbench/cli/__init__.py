"""The ``attnbench`` command line. Importing this package registers every command on ``app``."""
from attnbench.cli.app import app
from attnbench.cli import backends, ceilings, compare, gate, run, scenarios, trees  # noqa: F401  (register their commands on app)
from attnbench.cli import history, importer, report  # noqa: F401,E402  (register `history`, `import`, `report`)
from attnbench.cli import commits, show  # noqa: F401,E402  (register `compare commits`, `show`)
from attnbench.cli import decide  # noqa: F401,E402  (register `decide`)

__all__ = ["app"]
