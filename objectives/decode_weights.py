"""The weights a ``decode_step`` study decodes: the shared GPT pretrained on the synthetic task, and its GPTQ layers.

Both are computed once per key (model shape, seed, steps; for GPTQ also bits, group, int8 blocks and the
calibration) and kept on disk (:func:`pretrain_cache_dir`, written to a temporary name and renamed), so
a benchmark's driver and every study's worker decode the same weights and only the first process pays.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from models.config import GPTConfig

#: Sequences per step of the synthetic pretraining (``train_steps``), and its peak learning rate.
PRETRAIN_MICRO_BATCH = 8
PRETRAIN_LR = 1e-3


def pretrain_cache_dir() -> Path:
    """Where trained weights are kept between processes: ``$TUNER_CACHE_DIR/pretrained`` (default
    ``~/.cache/gpu-tuner/pretrained``)."""
    root = os.environ.get("TUNER_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gpu-tuner")
    return Path(root) / "pretrained"


def _cache_file(directory: Path, prefix: str, key: dict[str, Any], device_type: str) -> Path:
    """``directory/prefix-<digest of key>-<device type>.pt``: one file per distinct ``key``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return directory / f"{prefix}-{digest}-{device_type}.pt"


def _save_atomically(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary name, then rename: a process reading the cache never sees half a file."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def pretrained_state(cfg: GPTConfig, seed: int, steps: int, torch_device: str) -> tuple[dict[str, Any], list[float]]:
    """The bf16 state dict of the ``seed`` model after ``steps`` steps of :func:`models.gpt.pretrain`, and its losses.

    Trained once per (shape, seed, steps, device type) and kept on disk (:func:`pretrain_cache_dir`,
    written to a temporary name and renamed), so the benchmark's driver and every study's worker
    decode the same weights and only the first process pays for the training.
    """
    import torch

    from models.gpt import make_model, pretrain

    path = _cache_file(pretrain_cache_dir(), "gpt", _pretrain_key(cfg, seed, steps), torch.device(torch_device).type)
    if path.exists():
        saved = torch.load(path, map_location=torch_device, weights_only=True)
        return saved["state"], list(saved["losses"].tolist())
    model = make_model(cfg, seed, torch_device)  # fp32 master weights for training
    losses = pretrain(model, steps, seed, micro_batch=PRETRAIN_MICRO_BATCH, lr=PRETRAIN_LR)
    state = {name: t.detach().to(torch.bfloat16) for name, t in model.state_dict().items()}
    del model
    _save_atomically({"state": state, "losses": torch.tensor(losses)}, path)
    return state, losses


#: GPTQ calibration: sequences of uniform synthetic tokens (the prompts' distribution, another seed)
#: and their length (at most the model's ``seq_len``).
CALIBRATION_SEQUENCES = 16
CALIBRATION_LEN = 512
#: The calibration tokens' generator seed is the workload's ``seed`` plus this (the prompts use ``seed``).
CALIBRATION_SEED_OFFSET = 2000


def _pretrain_key(cfg: GPTConfig, seed: int, steps: int) -> dict[str, Any]:
    return {"cfg": cfg.to_dict(), "seed": seed, "steps": steps, "mb": PRETRAIN_MICRO_BATCH, "lr": PRETRAIN_LR}


def calibration_tokens(cfg: GPTConfig, seed: int, torch_device: str) -> Any:
    """The GPTQ calibration tokens ``[CALIBRATION_SEQUENCES, min(seq_len, CALIBRATION_LEN)]`` of ``seed``."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed + CALIBRATION_SEED_OFFSET)
    shape = (CALIBRATION_SEQUENCES, min(cfg.seq_len, CALIBRATION_LEN))
    return torch.randint(0, cfg.vocab_size, shape, generator=generator).to(torch_device)


def gptq_model(
    base: Any, cfg: GPTConfig, seed: int, train_steps: int, bits: int, group: int, int8_first_blocks: int
) -> Any:
    """A copy of ``base`` (the seeded model after ``train_steps``) quantized by GPTQ (:mod:`models.gptq`).

    The quantized layers are computed once per (weights, bits, group, int8 blocks, device type) and
    kept on disk beside the pretrained weights (:func:`pretrain_cache_dir`): GPTQ of the 1B preset
    takes seconds of GPU time per Linear, and every study's worker decodes the same layers.
    """
    import torch

    from models.gptq import gptq_layers
    from models.quant_linear import QuantLinear, quantize_linears

    device = next(base.parameters()).device
    key = {
        "weights": _pretrain_key(cfg, seed, train_steps),
        "bits": bits,
        "group": group,
        "int8_first_blocks": int8_first_blocks,
        "calibration": [CALIBRATION_SEQUENCES, CALIBRATION_LEN, seed + CALIBRATION_SEED_OFFSET],
    }
    path = _cache_file(pretrain_cache_dir().parent / "gptq", "gptq", key, device.type)
    if path.exists():
        saved = torch.load(path, map_location=device, weights_only=True)
        layers = {
            name: QuantLinear(t["qweight"], t["scales"], t.get("bias"), int(t["bits"]), group)
            for name, t in saved.items()
        }
    else:
        layers = gptq_layers(base, bits, group, calibration_tokens(cfg, seed, str(device)), int8_first_blocks)
        saved = {}
        for name, m in layers.items():
            saved[name] = {"qweight": m.qweight, "scales": m.scales, "bits": torch.tensor(m.bits)}
            if m.bias is not None:
                saved[name]["bias"] = m.bias
        _save_atomically(saved, path)
    return quantize_linears(base, bits, group, select=lambda name, _: name in layers, prebuilt=layers)
