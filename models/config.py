"""The GPT's shape (:class:`GPTConfig`), its named presets and its model FLOPs: plain Python, no torch.

Kept apart from :mod:`models.gpt` (which re-exports every name here) so that a workload's
``__init__`` and ``static_check`` can validate a model shape and count its FLOPs without
importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. ``d_ff`` defaults to ``4 * d_model``; ``d_model`` must divide by ``n_heads``."""

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    d_ff: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "d_ff" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GPTConfig.{f.name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    @property
    def ff(self) -> int:
        """The MLP's hidden width: ``d_ff`` or ``4 * d_model``."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def n_params(self, embedding: bool = True) -> int:
        """Parameter count. ``embedding=False`` leaves out the token and position tables
        (the tied LM head is the token table, so it is left out too)."""
        d, ff = self.d_model, self.ff
        per_layer = 3 * d * d + d * d + 2 * d * ff + 2 * d  # qkv, out proj, MLP, two RMSNorm scales
        body = self.n_layers * per_layer + d  # + final norm
        if not embedding:
            return body
        return body + self.vocab_size * d + self.seq_len * d

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Named model shapes. "tiny" is for CPU tests; the others follow GPT-2 small/medium and a 0.98B
#: (0.91B non-embedding) model at seq 2048, whose fp32 weights, gradients and AdamW moments (15.6 GB)
#: leave room for activations under a 24 GB card's limit.
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab_size=256, n_layers=2, d_model=64, n_heads=4, seq_len=32),
    "125m": GPTConfig(vocab_size=50304, n_layers=12, d_model=768, n_heads=12, seq_len=1024),
    "350m": GPTConfig(vocab_size=50304, n_layers=24, d_model=1024, n_heads=16, seq_len=1024),
    "1b": GPTConfig(vocab_size=32000, n_layers=18, d_model=2048, n_heads=16, seq_len=2048),
}


def model_flops_per_token(
    cfg: GPTConfig, training: bool, context_len: int | None = None, causal_halved: bool = False
) -> float:
    """Model FLOPs per token (PaLM appendix B style), the numerator of MFU.

    ``N = cfg.n_params(embedding=False) + vocab_size * d_model``: every weight a token multiplies,
    i.e. the blocks plus the LM head matmul (tied to the token table, whose *lookup* costs nothing);
    the position table is left out. Attention scores and values add ``2 * 2 * n_layers * T * d_model``
    forward FLOPs per token over a context of ``T = context_len`` (default ``cfg.seq_len``) keys.

    - training: ``6 * N + 12 * n_layers * T * d_model`` (forward + backward = 3x forward), PaLM's
      ``6N + 12 L H Q T``: it counts the full ``T x T`` score matrix, as PaLM and nanoGPT do, although a
      causal kernel skips half of it. ``causal_halved=True`` counts the half a causal kernel computes
      (``6 * n_layers * T * d_model``).
    - inference: ``2 * N + 4 * n_layers * T * d_model`` (forward only; for one decoded token, T is the
      number of cached positions it attends over, and no halving applies).
    """
    n = cfg.n_params(embedding=False) + cfg.vocab_size * cfg.d_model
    t = cfg.seq_len if context_len is None else context_len
    attention = 4.0 * cfg.n_layers * t * cfg.d_model
    if causal_halved and training:
        attention /= 2
    return (6.0 * n + 3.0 * attention) if training else (2.0 * n + attention)


def resolve_config(model: str | GPTConfig | dict[str, Any]) -> GPTConfig:
    """A :class:`GPTConfig` from a preset name, a dict of its fields, or a config; ValueError otherwise."""
    if isinstance(model, GPTConfig):
        return model
    if isinstance(model, str):
        if model not in PRESETS:
            raise ValueError(f"model must be a preset ({', '.join(PRESETS)}) or a dict of GPTConfig fields")
        return PRESETS[model]
    if isinstance(model, dict):
        known = {f.name for f in fields(GPTConfig)}
        unknown = sorted(set(model) - known)
        if unknown:
            raise ValueError(f"model has unknown GPTConfig fields {unknown}; known: {sorted(known)}")
        try:
            return GPTConfig(**model)
        except TypeError as exc:
            raise ValueError(f"model: {exc}") from None
    raise ValueError(f"model must be a preset name or a dict of GPTConfig fields, got {model!r}")
