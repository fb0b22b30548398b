"""The read-floor kernels of the int4 roofline benchmark (bench/stream_floor.py) read every word once."""

from __future__ import annotations

import functools

import pytest
import torch


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "config",
    [
        {"kind": "flat", "programs": 3, "BLOCK": 1024, "num_warps": 4, "num_stages": 1},
        {"kind": "flat", "programs": 7, "BLOCK": 1024, "num_warps": 4, "num_stages": 3},
        {"kind": "tma", "programs": 5, "BOX_R": 16, "BOX_N": 32, "num_warps": 4, "num_stages": 3},
    ],
    ids=["flat", "flat-ragged-grid", "tma"],
)
def test_read_floor_kernels_xor_every_word_once(interpreter: None, config: dict) -> None:
    """The XOR of what the programs store is the XOR of the whole buffer: no word skipped or read twice
    (a word read twice would cancel), with a ragged last block and boxes that overhang the edges."""
    from bench.stream_floor import read_flat_kernel, read_tma_kernel

    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (40, 96), dtype=torch.int32, generator=gen)
    expected = functools.reduce(lambda a, b: a ^ b, words.view(-1).tolist())
    out = torch.zeros(config["programs"], dtype=torch.int32)
    if config["kind"] == "flat":
        grid = (config["programs"],)
        read_flat_kernel[grid](words.view(-1), out, words.numel(), BLOCK=config["BLOCK"], STAGES=config["num_stages"])
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor(words, [40, 96], [96, 1], [config["BOX_R"], config["BOX_N"]])
        read_tma_kernel[(config["programs"],)](desc, out, 40, 96, BOX_R=16, BOX_N=32, STAGES=3)
    assert functools.reduce(lambda a, b: a ^ b, out.tolist()) == expected
