"""The Python a ``decode_step`` winner exports (:meth:`objectives.decode_step.DecodeStep.export_python`): the
tuned decoder built with ``models.gpt``, ``models.quant_linear`` (and ``models.gptq``), ready to paste."""

from __future__ import annotations

from typing import Any

from objectives.decode_rules import partials_store
from objectives.decode_weights import CALIBRATION_LEN, CALIBRATION_SEQUENCES
from tuner.workloads.base import comment_text


def decoder_source(e: dict[str, Any]) -> str:
    """The source for an exported config ``e`` (:meth:`objectives.decode_step.DecodeStep.export_config`)."""
    weights = "bf16" if e["weight_bits"] == 16 else f"int{e['weight_bits']}"
    lines = [
        "import torch",
        "",
        "from models.gpt import make_model, resolve_config",
        "from models.quant_linear import autotune_tiles, quantize_decoder",
        "",
        "# "
        + comment_text(
            f"decode_step: batch {e['batch']}, {weights} weights, {e['kv_cache_dtype']} KV cache, "
            f"{e['attention']} attention, CUDA graphs {'on' if e['cuda_graphs'] else 'off'}, "
            f"torch.compile {e['compile']}"
        ),
        f"cfg = resolve_config({e['model']!r})",
        f"model = make_model(cfg, seed=0, device='cuda', dtype=torch.bfloat16, attention={e['attention']!r})",
    ]
    if e["quantizer"] == "gptq":
        lines += [
            "from models.gptq import gptq_decoder",
            "",
            f"# GPTQ calibrates on tokens [B, S]: the study used {CALIBRATION_SEQUENCES} sequences of "
            f"{CALIBRATION_LEN} synthetic tokens; use text of your own",
            f"calibration = torch.randint(0, cfg.vocab_size, ({CALIBRATION_SEQUENCES}, "
            f"min(cfg.seq_len, {CALIBRATION_LEN})), device='cuda')",
            f"model = gptq_decoder(model, bits={e['weight_bits']!r}, group_size={e['group_size']!r}, "
            f"calibration=calibration, int8_first_blocks={e['int8_first_blocks']!r})",
        ]
    elif e["weight_bits"] != 16:
        lines.append(
            f"model = quantize_decoder(model, bits={e['weight_bits']!r}, group_size={e['group_size']!r}, "
            f"int8_first_blocks={e['int8_first_blocks']!r})"
        )
    if e.get("lm_head_bits", 16) != 16:  # the tied LM head as a quantized copy of the embedding
        lines += [
            "from models.quant_linear import quantize_head",
            "",
            f"model = quantize_head(model, bits={e['lm_head_bits']!r}, group_size={e['group_size']!r})",
        ]
    if e.get("quant_kernel") == "packed":  # the quantized layers' words laid out for the packed kernel
        lines += ["from models.quant_linear import pack_linears", "", "model = pack_linears(model)"]
    flags = []
    if e.get("fuse_gelu"):  # the MLP's GELU in the epilogue of its first product
        flags.append("    block.mlp.fuse_gelu = True")
    if e.get("pdl") and e["attention"] == "flash_decode":  # the decode attention kernels as dependent launches
        flags.append("    block.attn.decode_pdl = True")
    if flags:
        lines += ["for block in model.blocks:", *flags]
    if e["weight_bits"] != 16:
        # split_sums=fused(16): split-K tiles may leave their partial products (fp32, or 16-bit: partials=2) to the
        # next operation (torch.compile sums them there)
        partials = {0: "", 1: ", partials=True", 2: ", partials=2"}[partials_store(e)]
        pdl = ", pdl=True" if e.get("pdl") else ""  # the warp-specialized tiles launched as programmatic dependents
        lines.append(
            f"autotune_tiles(model, m={e['batch']!r}{partials}{pdl})  # times kernel tiles per Linear shape (GPU only)"
        )
    lines += [
        f"batch, kv_dtype, cuda_graphs = {e['batch']!r}, {e['kv_cache_dtype']}, {e['cuda_graphs']!r}",
        "cache = model.init_cache(batch, max_len=cfg.seq_len, dtype=kv_dtype)",
    ]
    if e["compile"] != "off" and e.get("pdl"):  # Inductor's kernels launched as programmatic dependents too
        lines += [
            "import torch._inductor",
            "",
            f"options = {{**torch._inductor.list_mode_options({e['compile']!r}), 'triton.enable_pdl': True}}",
            "decode = torch.compile(model.decode, dynamic=False, options=options)",
        ]
    elif e["compile"] != "off":
        lines.append(f"decode = torch.compile(model.decode, mode={e['compile']!r}, dynamic=False)")
    else:
        lines.append("decode = model.decode")
    lines += [
        "# per step: logits = decode(tokens[B, 1], cache, pos) with pos a 0-dim long CUDA tensor,",
        "# captured once in a torch.cuda.CUDAGraph when cuda_graphs, then pos.add_(1) and replay",
        "",
    ]
    return "\n".join(lines)
