"""The prefill routes: the Triton prefill kernel (prefill) and the Gluon one (gluon-prefill, Hopper)."""
