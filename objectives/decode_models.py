"""The models a ``decode_step`` worker keeps (:mod:`objectives.decode_step`): the seeded bf16 GPT per device and
attention mode (trained first when asked), its quantized copies (least recently used dropped past
:data:`MAX_VARIANTS`) and the bf16 model's greedy decode per batch, which every config is compared with.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from models.config import GPTConfig
from objectives.decode_weights import gptq_model, pretrained_state

#: Quantized model variants kept per worker (least recently used dropped first).
MAX_VARIANTS = 4


@dataclass
class _Reference:
    """The bf16 model's greedy decode of one batch: what every config is compared with."""

    prompt: Any  # [B, P] long
    teacher: Any  # [G, B] long: the input token of each decode step
    logits: Any  # [G, B, V] fp32
    top1: Any  # [G, B] long: argmax of ``logits``


class DecodeModels:
    """The bf16 base models, their quantized variants and the references of one ``decode_step`` workload."""

    def __init__(self, cfg: GPTConfig, seed: int, train_steps: int, prompt_len: int, gen_tokens: int) -> None:
        self.cfg, self.seed, self.train_steps = cfg, seed, train_steps
        self.prompt_len, self.gen_tokens = prompt_len, gen_tokens
        self.max_len = prompt_len + gen_tokens
        self.pretrain_losses: list[float] = []
        self.bases: dict[tuple[str, str], Any] = {}  # (device, attention) -> bf16 GPT
        self.variants: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.refs: dict[tuple[str, int], _Reference] = {}

    def base(self, attention: str, torch_device: str) -> Any:
        """The bf16 model with ``attention`` on ``torch_device``, built on first use (same seed: same weights)."""
        key = (torch_device, attention)
        model = self.bases.get(key)
        if model is None:
            import torch

            from models.gpt import make_model

            model = make_model(self.cfg, self.seed, torch_device, torch.bfloat16, attention=attention)
            if self.train_steps:
                state, self.pretrain_losses = pretrained_state(self.cfg, self.seed, self.train_steps, torch_device)
                model.load_state_dict(state)
            model.requires_grad_(False).eval()
            self.bases[key] = model
        return model

    def variant(
        self,
        attention: str,
        bits: int,
        group: int | None,
        torch_device: str,
        int8_first_blocks: int = 0,
        quantizer: str | None = "rtn",
        quant_kernel: str = "tiled",
        lm_head_bits: int = 16,
        fuse_gelu: bool = False,
        attention_pdl: bool = False,
    ) -> tuple[Any, int]:
        """The model of a config and its parameter bytes: the base, or a quantized copy sharing its other tensors
        (with ``quant_kernel="packed"``, the quantized layers' words laid out for the packed kernel; with
        ``lm_head_bits`` 8 or 4 the tied LM head a quantized copy of the embedding, round-to-nearest, the config's
        group size; with ``fuse_gelu`` the MLPs' GELU in their ``fc`` products' epilogue; with ``attention_pdl``
        the ``flash_decode`` kernels launched as programmatic dependents: those two as a copy of the variant
        without them, every tensor shared)."""
        import copy

        from models.quant_linear import pack_linears, parameter_bytes, quantize_decoder, quantize_head

        base = self.base(attention, torch_device)
        if bits == 16 and not attention_pdl:
            return base, parameter_bytes(base)
        args = (attention, bits, group, torch_device, int8_first_blocks, quantizer, quant_kernel, lm_head_bits)
        key = (torch_device, attention, bits, group, int8_first_blocks, quantizer, quant_kernel, lm_head_bits,
               fuse_gelu, attention_pdl)  # fmt: skip
        entry = self.variants.get(key)
        if entry is None and (fuse_gelu or attention_pdl):
            plain, size = self.variant(*args)
            memo: dict[int, Any] = {id(t): t for t in [*plain.parameters(), *plain.buffers()]}
            model = copy.deepcopy(plain, memo)
            for block in model.blocks:
                block.mlp.fuse_gelu = fuse_gelu
                block.attn.decode_pdl = attention_pdl
            entry = (model, size)
            self.variants[key] = entry
            while len(self.variants) > MAX_VARIANTS:
                self.variants.popitem(last=False)
        if entry is None:
            if quantizer == "gptq":
                model = gptq_model(base, self.cfg, self.seed, self.train_steps, bits, int(group), int8_first_blocks)
            else:
                model = quantize_decoder(base, bits, int(group), int8_first_blocks)  # type: ignore[arg-type]
            if lm_head_bits != 16:
                model = quantize_head(model, lm_head_bits, int(group))  # type: ignore[arg-type]
            if quant_kernel == "packed":
                model = pack_linears(model)
            entry = (model, parameter_bytes(model))
            self.variants[key] = entry
            while len(self.variants) > MAX_VARIANTS:
                self.variants.popitem(last=False)
        self.variants.move_to_end(key)
        return entry

    def reference(self, batch: int, torch_device: str) -> _Reference:
        """Greedy decode of the bf16 model (sdpa, bf16 cache, eager) from the seeded prompt, built once per batch."""
        key = (torch_device, batch)
        ref = self.refs.get(key)
        if ref is not None:
            return ref
        import torch

        cfg = self.cfg
        model = self.base("sdpa", torch_device)
        generator = torch.Generator(device="cpu").manual_seed(self.seed)
        prompt = torch.randint(0, cfg.vocab_size, (batch, self.prompt_len), generator=generator).to(torch_device)
        teacher = torch.empty((self.gen_tokens, batch), dtype=torch.long, device=torch_device)
        logits = torch.empty((self.gen_tokens, batch, cfg.vocab_size), dtype=torch.float32, device=torch_device)
        with torch.no_grad():
            kv = model.init_cache(batch, self.max_len, torch.bfloat16, torch_device)
            token = model.prefill(prompt, kv)[:, -1].argmax(dim=-1)
            pos = torch.zeros((), dtype=torch.long, device=torch_device)
            for t in range(self.gen_tokens):
                teacher[t] = token
                pos.fill_(self.prompt_len + t)
                step = model.decode(token.view(batch, 1), kv, pos)[:, 0].float()
                logits[t] = step
                token = step.argmax(dim=-1)
        del kv
        ref = _Reference(prompt, teacher, logits, logits.argmax(dim=-1))
        self.refs[key] = ref
        return ref

    def reference_stats(self, batch: int, torch_device: str) -> dict[str, Any]:
        """The bf16 model's greedy tokens at ``batch`` (the tokens top-1 agreement is measured on) and how
        diverse they are: a model that repeats one token agrees with anything that repeats it too."""
        import torch

        ref = self.reference(batch, torch_device)
        teacher = ref.teacher  # (gen_tokens, batch)
        per_sequence = [int(teacher[:, b].unique().numel()) for b in range(teacher.shape[1])]
        # How far the greedy choice stands above the runner-up: small margins are what quantization flips.
        top2 = ref.logits.topk(2, dim=-1).values
        margins = (top2[..., 0] - top2[..., 1]).flatten().float().cpu()
        quantiles = torch.quantile(margins, torch.tensor([0.05, 0.25, 0.5]))
        return {
            "tokens": int(teacher.numel()),
            "distinct": int(teacher.unique().numel()),
            "distinct_per_sequence_mean": sum(per_sequence) / len(per_sequence),
            "first_sequence": teacher[:, 0].tolist(),
            "top1_margin_logits": {
                "p05": round(float(quantiles[0]), 4),
                "p25": round(float(quantiles[1]), 4),
                "median": round(float(quantiles[2]), 4),
                "below_0.1": round(float((margins < 0.1).float().mean()), 4),
                "tied": round(float((margins == 0).float().mean()), 4),
            },
        }
