"""attnbench: benchmark and profile paged and tree attention backends."""

__version__ = "0.1.0"
