# study gemm-8192, trial 4, workload triton_gemm
import triton

# 8192x8192x8192, operands in fp8; kernel variant 'persistent_tma_ws', the config of kernels.gemm_tma.matmul_persistent
configs = [
    triton.Config({'BLOCK_M': 128, 'BLOCK_N': 256, 'BLOCK_K': 128, 'GROUP_M': 8, 'EPILOGUE_SUBTILE': True, 'WARP_SPECIALIZE': True, 'FP8_FAST_ACCUM': True}, num_warps=8, num_stages=4),
]

# The persistent kernel takes the config as keyword arguments of matmul_persistent; num_sms is the
# device's multiprocessor count (one program per SM).
from kernels.gemm_tma import matmul_persistent  # noqa: E402

GEMM_CONFIG = dict(
    precision='fp8',
    BLOCK_M=128,
    BLOCK_N=256,
    BLOCK_K=128,
    GROUP_M=8,
    num_warps=8,
    num_stages=4,
    epilogue_subtile=True,
    warp_specialize=True,
    fp8_fast_accum=True,
)
# c = matmul_persistent(a, b, num_sms=torch.cuda.get_device_properties(0).multi_processor_count, **GEMM_CONFIG)
