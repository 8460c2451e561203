"""Built-in backends, one module each (installed as ``attnbench.backends``).

Modules import their GPU library lazily, inside ``plan``/``run`` or ``unavailable``, so that
importing attnbench never imports one.
"""
