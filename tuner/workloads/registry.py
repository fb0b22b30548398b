"""Workload registry: names mapped to ``module:Class`` strings, imported on first use.

Importing this module imports neither torch nor triton, so the CLI and the API
list workloads fast.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.workloads.base import Workload

WORKLOADS: dict[str, str] = {
    "axpy": "objectives.axpy:Axpy",
    "triton_gemm": "objectives.triton_gemm:TritonGemm",
    "flash_attention": "objectives.flash_attention:FlashAttention",
    "noop": "objectives.noop:NoOp",
    "quant_gemm": "objectives.quant_gemm:QuantGemm",
    "replay": "objectives.replay:Replay",
    "rmsnorm": "objectives.rmsnorm:RMSNorm",
    "softmax": "objectives.softmax:Softmax",
    "train_step": "objectives.train_step:TrainStep",
    "decode_step": "objectives.decode_step:DecodeStep",
    "collective": "objectives.collective:Collective",
    "ddp_step": "objectives.ddp_step:DDPStep",
}


class UnknownWorkload(KeyError):
    def __str__(self) -> str:
        return f"unknown workload {self.args[0]!r}; known: {', '.join(sorted(WORKLOADS))}"


@cache
def workload_class(name: str) -> type[Workload]:
    """The class registered under ``name``; raises :class:`UnknownWorkload`."""
    try:
        target = WORKLOADS[name]
    except KeyError:
        raise UnknownWorkload(name) from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def workload_names() -> list[str]:
    return sorted(WORKLOADS)
