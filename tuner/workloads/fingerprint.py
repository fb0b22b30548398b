"""Hardware/software fingerprint recorded with every trial, and the :class:`DeviceInfo` of this process.

Both are cheap: torch is imported lazily (and only if installed), triton's
version is read from package metadata without importing it, and the driver
version (a subprocess call of ``nvidia-smi`` when pynvml is absent) is looked
up once per process.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import shutil
import socket
import subprocess
import sys
from typing import Any

from tuner.workloads.base import DeviceInfo, interpreter_active

#: Opt-in shared memory per block (bytes) by compute capability, for torch builds whose
#: device properties lack ``shared_memory_per_block_optin``.
SMEM_PER_BLOCK_OPTIN_BYTES: dict[tuple[int, int], int] = {
    (9, 0): 232448,
    (8, 0): 166912,
    (8, 6): 101376,
    (8, 7): 166912,
    (8, 9): 101376,
    (7, 5): 65536,
    (7, 0): 98304,
}


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _cuda_available(torch: Any | None) -> bool:
    return bool(torch is not None and torch.cuda.is_available())


@functools.cache
def driver_version() -> str | None:
    """The NVIDIA driver version (e.g. ``"580.159.03"``), or None when there is none to ask."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        completed = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
    return lines[0] if lines else None


def fingerprint() -> dict[str, Any]:
    """Versions and hardware that a timing depends on; never compare timings across fingerprints.

    Keys: ``hostname``, ``python``, ``torch``, ``triton``, ``cuda`` (the CUDA
    version torch was built with), ``driver``, ``nccl``, ``gpu_names``,
    ``gpu_count``, ``device_kind`` (``"cuda"`` or ``"cpu"``), ``triton_interpret``.
    Missing pieces are None.
    """
    torch = _torch()
    cuda = _cuda_available(torch)
    gpu_names: list[str] = []
    nccl: str | None = None
    if cuda:
        gpu_names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            raw = torch.cuda.nccl.version()
            nccl = ".".join(str(part) for part in raw) if isinstance(raw, tuple) else str(raw)
        except Exception:
            nccl = None
    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__ if torch is not None else None,
        "triton": _package_version("triton"),
        "cuda": torch.version.cuda if torch is not None else None,
        "driver": driver_version() if cuda or shutil.which("nvidia-smi") else None,
        "nccl": nccl,
        "gpu_names": gpu_names,
        "gpu_count": len(gpu_names),
        "device_kind": "cuda" if cuda else "cpu",
        "triton_interpret": interpreter_active(),
        "platform": sys.platform,
    }


def device_info(index: int | None = None) -> DeviceInfo:
    """What static feasibility rules may know about device ``index`` (default: the current one).

    On CUDA: name, compute capability, opt-in shared memory per block in bytes
    (from the device properties, else :data:`SMEM_PER_BLOCK_OPTIN_BYTES`), SM
    count and total memory in bytes. Without CUDA: ``DeviceInfo(kind="cpu")``
    named after the processor.
    """
    torch = _torch()
    if not _cuda_available(torch):
        return DeviceInfo(kind="cpu", name=platform.processor() or "cpu")
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    capability = (int(props.major), int(props.minor))
    smem = getattr(props, "shared_memory_per_block_optin", None)
    if not smem:
        smem = SMEM_PER_BLOCK_OPTIN_BYTES.get(capability)
    return DeviceInfo(
        kind="cuda",
        name=props.name,
        compute_capability=capability,
        smem_per_block_bytes=int(smem) if smem else None,
        sm_count=int(props.multi_processor_count),
        total_memory_bytes=int(props.total_memory),
    )
