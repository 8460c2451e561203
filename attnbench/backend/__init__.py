"""The backend contract, capability reasons, and the registry of backends.

A backend is a plugin (``from attnbench.backend import Backend, register``):

- declared capabilities (class attributes: ``dtypes``, ``head_dims``, ``page_size_multiple``,
  ``cuda_only``, ``max_group``, ``kinds``, ...) from which the base class writes the standard
  skip reasons, one wording each; ``unsupported(batch)`` adds what is special to the backend.
  The runner asks ``reasons(batch)``: both, an empty list meaning the backend can run it;
- ``convert(batch)`` (optional): what attnbench does only because the library cannot read
  this batch natively (K/V gathered out of the pages, dense masks no engine would build),
  timed apart as convert_ms. By default it returns the batch unchanged;
- ``plan(converted)``: the per-step work an engine does to turn its metadata into the
  library's launch inputs (the library's own plan call included), timed as plan_ms. It
  receives what ``convert`` returned (the batch itself by default) and returns a plan object;
  a ``mode`` attribute on that object (the route the plan chose) goes into the row;
- ``run(plan)`` launches the kernels and returns ``[N, Hq, D]``.

Why ``convert`` is a separate call whose result ``plan`` receives (and not a part the plan
reports about itself): the runner times each call on its own with the one host timer, so no
backend times itself; a backend that needs no conversion, or a plugin written before
``convert`` existed, implements plan/run only and gets ``convert_ms = 0``; and ``plan`` cannot
redo a conversion by accident, because it is handed the converted inputs.

Options: a backend declares ``options`` (``BackendOption``: choices or a type, a default, an
environment variable that may set it); ``-b NAME:key=value,...`` picks them, the instance reads
``self.option(key)``, and the row's backend is the canonical spec (``attnbench.backend.options``).

Backends are found by name in the built-in table (``builtin``: imported lazily, so importing
attnbench never imports a GPU library), in the ``attnbench.backends`` entry-point group, or
in a file named with ``--backend-file`` (which runs that file's code).

The modules: ``contract`` (the ``Backend`` base class), ``options`` (``BackendOption``, specs and
the backend identity ``BackendId``/``ResolvedSpec``), ``reasons`` (the standard skip reasons),
``builtin`` (the built-in backends' table), ``registry`` (names to classes, specs resolved) and
``files`` (``--backend-file``). The names below are the public API plugins and scripts import.
"""
from attnbench.backend.builtin import BUILTIN, BUILTIN_INFO, BuiltinInfo
from attnbench.backend.contract import Backend
from attnbench.backend.files import load_backend_file
from attnbench.backend.options import BackendId, BackendOption, OptionError, ResolvedSpec, backend_name, parse_spec
from attnbench.backend.reasons import device_reason
from attnbench.backend.registry import (
    UnknownBackend, all_names, canonical_spec, get_backend_class, make_backend, register, resolve_spec, user_backend_id,
)

__all__ = [
    "BUILTIN", "BUILTIN_INFO", "Backend", "BackendId", "BackendOption", "BuiltinInfo", "OptionError", "ResolvedSpec",
    "UnknownBackend", "all_names", "backend_name", "canonical_spec", "device_reason", "get_backend_class",
    "load_backend_file", "make_backend", "parse_spec", "register", "resolve_spec", "user_backend_id",
]
