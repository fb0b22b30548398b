"""The project's Triton and Gluon kernels in family folders (``gemm``, ``attention``, ``quant``, ``norms``,
``elementwise``), standalone: they import torch, triton, the standard library and ``kernels`` only
(``runtime`` for the interpreter check, ``gluon_compat`` for the Gluon names three families share)."""
