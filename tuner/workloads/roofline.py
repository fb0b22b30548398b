"""Where a trial stands under the hardware's limits: peak FLOP/s by GPU and precision, copy bandwidth.

A workload states the FLOPs and the fewest bytes its config must move (``Workload.work``); with
the measured latency, a trial's arithmetic intensity (FLOP/byte), its roof
``min(peak FLOP/s for the precision, intensity x bandwidth)`` and the fraction of that roof it
achieved follow. Peaks are dense (no sparsity) datasheet figures, keyed by GPU name; the
bandwidth is measured on the worker (a device-to-device copy, bytes read plus written).
"""

from __future__ import annotations

from typing import Any

#: Dense peak TFLOP/s by precision (SXM parts; "tf32" = tensor-core fp32 inputs).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1, "fp16": 362.1, "fp8": 733.0},
}


def peaks_for(gpu_name: str) -> dict[str, float] | None:
    """The peak table of the GPU whose name contains a known model (e.g. "NVIDIA H200"), else None."""
    for model, peaks in PEAK_TFLOPS.items():
        if model in gpu_name:
            return dict(peaks)
    return None


def measure_copy_bandwidth_gbps(size_bytes: int = 1 << 30, reps: int = 10) -> float | None:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), median of ``reps``; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times_ms = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    times_ms.sort()
    median_ms = times_ms[len(times_ms) // 2]
    del src, dst
    torch.cuda.empty_cache()
    return 2 * size_bytes / (median_ms * 1e-3) / 1e9


def roofline_metrics(
    flops: float, bytes_moved: float, latency_ms: float, peak_tflops: float | None, bandwidth_gbps: float | None
) -> dict[str, float]:
    """``arithmetic_intensity`` (FLOP/byte) and ``achieved_tflops`` always (so a memory-bound workload
    that reports GB/s still has a point on the roofline); ``roof_tflops`` and ``roofline_fraction`` when
    both limits are known. Empty when the inputs cannot give a position."""
    if flops <= 0 or bytes_moved <= 0 or latency_ms <= 0:
        return {}
    intensity = flops / bytes_moved
    achieved_tflops = flops / (latency_ms * 1e-3) / 1e12
    out = {"arithmetic_intensity": intensity, "achieved_tflops": achieved_tflops}
    if peak_tflops and bandwidth_gbps:
        roof_tflops = min(peak_tflops, intensity * bandwidth_gbps / 1000)
        out["roof_tflops"] = roof_tflops
        out["roofline_fraction"] = achieved_tflops / roof_tflops
    return out


def gpu_clock_and_temperature() -> dict[str, float]:
    """SM clock (MHz) and temperature (C) of this process's GPU from NVML, or {} when NVML is not there."""
    import os

    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        index = torch.cuda.current_device()
        # NVML numbers all GPUs; CUDA numbers the visible ones (Ray sets CUDA_VISIBLE_DEVICES per worker).
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if index < len(visible) and visible[index].isdigit():
            index = int(visible[index])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {
            "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "gpu_temp_c": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        }
    except Exception:  # telemetry is optional: any NVML failure means no reading
        return {}


def describe_roofline(gpu_name: str, bandwidth_gbps: float | None) -> dict[str, Any] | None:
    """What the dashboard's roofline chart draws: the peaks by precision and the measured bandwidth."""
    peaks = peaks_for(gpu_name)
    if peaks is None or not bandwidth_gbps:
        return None
    return {"peaks_tflops": peaks, "peak_tflops": max(peaks.values()), "bandwidth_gbps": bandwidth_gbps}
