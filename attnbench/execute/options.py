"""Run options (kept in ``store.options``, which the manifest records; importable from here
as before) and the error of ``--save-tensors``."""
from __future__ import annotations

from attnbench.store.options import RunOptions, options_from_json, options_to_json

__all__ = ["RunOptions", "SaveTensorsError", "options_from_json", "options_to_json"]


class SaveTensorsError(OSError):
    """``--save-tensors`` could not write a case's file: the run stops (the user asked for
    the tensors); the message names the folder, the case and the reason."""

    def __str__(self) -> str:
        return self.args[0] if self.args else "could not save tensors"
