"""Matrix multiplication kernels: the Triton tutorial GEMM (``gemm``), the persistent TMA kernels
(``gemm_tma``) and the warp-specialized Gluon ping-pong kernel (``gemm_ws``). They import torch, triton,
the standard library and ``kernels`` only."""
