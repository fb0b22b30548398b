"""Row-wise normalization kernels: RMSNorm (``rmsnorm``) and softmax (``softmax``). They import torch,
triton, the standard library and ``kernels`` only."""
