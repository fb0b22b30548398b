"""Attention kernels: the fused flash forward (``attention``) and its backward (``attention_grad``),
the persistent TMA forward (``attention_persistent``), the warp-specialized Gluon forward (``attention_ws``
with its loader, rules, steps and stream modules) and the split decode attention (``decode_attention``).
They import torch, triton, the standard library and ``kernels`` only."""
