# study gemm-8192, trial 3, workload triton_gemm
import triton

# 8192x8192x8192, operands in fp8
configs = [
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=3),
]
