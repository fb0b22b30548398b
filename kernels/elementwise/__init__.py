"""Elementwise kernels: ``axpy`` (``out = alpha * x + y``). It imports torch, triton and the standard
library only."""
