"""Weight-only int4/int8 GEMM kernels: the tiled kernel (``quant_gemm``, its torch-free static rules in
``quant_rules``), the packed-word kernel (``quant_gemm_packed``, with ``quant_layout``, ``quant_decode`` and
``quant_packed_steps``), the warp-specialized Gluon kernel (``quant_gemm_ws``, with ``quant_ws_rules`` and
``quant_ws_ptx``) and the weight format they share (``quant_weights``). They import torch, triton, the
standard library and ``kernels`` only."""
