"""SDPA whose work runs in a thread of its own (a pool), as a library with its own threads does
(loaded with --backend-file by tests/test_cpu_threads.py, issue 37 item 11)."""
from concurrent.futures import ThreadPoolExecutor

from attnbench.backends.sdpa import SdpaBackend

_POOL = ThreadPoolExecutor(1)


class PooledSdpa(SdpaBackend):
    name = "sdpa-pooled"

    def run(self, plan):
        return _POOL.submit(SdpaBackend.run, self, plan).result()
