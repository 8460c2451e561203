"""What the Gluon routes (decode, tree, prefill, MLA) share on the host: the device they need, the caches
their TMA views read, the pages their 64-key tiles take, and the words a route's refusal is given in."""
from __future__ import annotations

import functools
import inspect

import torch

FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
BLOCK_N = 64  # the Gluon kernels' key tile (the decode kernel takes 128 at head dim 64)


def hopper(device) -> bool:
    """A Hopper GPU (sm_90: warpgroup MMAs, TMA, setmaxnreg): every Gluon kernel here is built for it."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


# the Gluon API the kernels are written in (triton 3.6, the version they were measured on); a later triton may
# remove a name or leave it as a stub that raises when the kernel is compiled (triton 3.9: both below)
GLUON_API = (("gl", "thread_barrier"), ("tma", "async_copy_global_to_shared"))


@functools.lru_cache(maxsize=None)
def api_problem() -> str:
    """'' when the installed triton has the Gluon API the kernels use, else why not (in a skipped row's words):
    then every Gluon route refuses its batches, and ``route=auto`` runs them on the Triton routes. Asked once a
    process (``check_api``)."""
    return check_api()


def check_api() -> str:
    """``api_problem``'s answer, worked out from the installed triton each call."""
    try:
        import triton
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except Exception as e:  # no Gluon at all
        return f"the Gluon kernels need triton's Gluon (triton 3.6 measured): {type(e).__name__}: {e}"
    mods, gone = {"gl": gl, "tma": tma}, []
    for mod, name in GLUON_API:
        fn = getattr(mods[mod], name, None)
        if fn is None or "has been removed" in _source(fn):
            gone.append(f"{mod}.{name}")
    if gone:
        return (f"the Gluon kernels are written in triton 3.6's Gluon API, and triton {triton.__version__} removed "
                f"{' and '.join(gone)} (install triton 3.6, or run a Triton route: route=auto takes them)")
    return ""


def _source(fn) -> str:
    try:
        return inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return ""


def page_ok(page: int, block_n: int = BLOCK_N) -> bool:
    """Pages a ``block_n``-key tile reads as TMA boxes: a multiple of the tile, or whole pages of >= 8 keys in it."""
    return page % block_n == 0 or (block_n % page == 0 and page >= 8)


def cache_ok(batch) -> bool:
    """A 16-bit cache of q's dtype, or an FP8 one (its scales in ``k_scale`` / ``v_scale``)."""
    kd = batch.k_cache.dtype
    if kd in FP8_TYPES:
        return getattr(batch, "k_scale", None) is not None and batch.v_cache.dtype == kd
    return kd == batch.dtype and getattr(batch, "k_scale", None) is None


def kv_view(t: torch.Tensor):
    """(2-d rows view, ROW_PAGE, ROW_HEAD, COL_HEAD) of a [pages, page, kv heads, d] cache, or None."""
    pages, page, heads, d = t.shape
    s = t.stride()
    if s == (page * heads * d, heads * d, d, 1):  # NHD: rows = page x slot, columns = head x d
        return t.view(pages * page, heads * d), page, 0, d
    if s == (heads * page * d, d, page * d, 1):  # HND: rows = (page x head) x slot
        return torch.as_strided(t, (pages * heads * page, d), (d, 1)), heads * page, page, 0
    return None


def tma_problem(b, kernel: str) -> str:
    """'' when the Gluon ``kernel``'s TMA views (``kv_view``) can read the batch's q and caches, else why not."""
    if b.q.stride(2) != 1 or b.k_cache.data_ptr() % 16 or b.v_cache.data_ptr() % 16:
        return f"the Gluon {kernel} kernel needs q's last dimension contiguous and 16-byte aligned caches"
    if kv_view(b.k_cache) is None or kv_view(b.v_cache) is None:
        return f"the Gluon {kernel} kernel needs contiguous NHD or HND caches"
    return ""

