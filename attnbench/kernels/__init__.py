"""attnbench's own attention kernels (Triton and Gluon), apart from the library adapters: the ``triton`` backend
(attnbench/backends/triton.py) plans and runs batches through them.

Which kernel runs a batch: ``routes.py`` (the route table, ``select``), one route a kernel:

  route          kernel                                 host side (reasons, plan, launch)   device code
  paged          the one-launch Triton kernel: every    paged/launch.py, paged/plan.py       paged/kernels.py
                 batch of the paged layout, variants
  prefill        Triton prefill kernel                  prefill/launch.py                    prefill/kernels.py
  gluon-prefill  Gluon prefill kernel (Hopper)          prefill/gluon.py                     prefill/gluon_kernels.py
  gluon-tree     Gluon tree kernel (Hopper)             tree/gluon.py                        tree/gluon_kernels.py,
                                                                                             tree/mask.py
  gluon-decode   Gluon decode kernel (Hopper)           decode/gluon.py                      decode/gluon_kernels.py
  mla            Triton MLA kernel                      mla/plan.py                          mla/kernels.py
  gluon-mla      Gluon MLA kernel (Hopper)              mla/gluon.py, mla/plan.py            mla/gluon_kernels.py

``merge.py``: the split merge every MHA / GQA route launches after its kernel (shared/launch.py). ``shared/``: what
the routes share: the plan's tables (plan.py: the config and units; step.py and stage.py: built once per shape,
sent in one copy), the variants' inputs (features.py), launch arguments (launch.py), the Gluon routes' host checks
(gluon.py), and device helpers (tile_math.py, fp8_words.py, gluon_pages.py, gluon_steps.py, gluon_epilogue.py).

Layering: kernels/ sits below backends/ and imports only ``attnbench.workload`` (tests/test_layout.py).
"""
