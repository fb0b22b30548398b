"""The Python a ``train_step`` winner exports (:meth:`objectives.train_step.TrainStep.export_python`): a
``configure(model)`` function that applies the tuned knobs to a torch training loop, ready to paste."""

from __future__ import annotations

from typing import Any


def trainer_source(exported: dict[str, Any], mode: str, backend: str | None) -> str:
    """The source for an exported config (:meth:`objectives.train_step.TrainStep.export_config`) whose attention
    runs as ``mode`` (``GPT(attention=...)``), inside ``sdpa_kernel([SDPBackend.<backend>])`` when one is named."""
    precision = exported.get("precision", "fp32")
    autocast = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.bfloat16"}.get(precision)
    lines = [
        "import contextlib",
        "",
        "import torch",
        "from torch.nn.attention import SDPBackend, sdpa_kernel",
        "",
        f"# train_step config: {exported!r}",
        f"MICRO_BATCH = {exported['micro_batch']!r}",
        f"GRAD_ACCUM = {exported['grad_accum']!r}",
        f"CHECKPOINT_EVERY = {exported.get('checkpoint', 0)!r}  # GPT(checkpoint_every=...)",
        f"ATTENTION = {mode!r}  # GPT(attention=...)",
        f"FP8_LINEARS = {precision == 'fp8'!r}  # GPT(linear_factory=models.gpt.Fp8Linear)",
        "",
        "",
        "def configure(model, lr=1e-3):",
        '    """(model to call, optimizer, autocast context factory, GradScaler or None, SDPA context factory)."""',
        f"    torch.set_float32_matmul_precision({'high' if precision == 'tf32' else 'highest'!r})",
    ]
    if exported.get("compile", "off") != "off":
        lines.append(f"    model = torch.compile(model, mode={exported['compile']!r})")
    fused = exported.get("optimizer") == "adamw_fused"
    lines.append(
        f"    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, {'fused' if fused else 'foreach'}=True)"
    )
    if autocast:
        lines.append(f"    autocast = lambda: torch.autocast('cuda', dtype={autocast})")
    else:
        lines.append("    autocast = contextlib.nullcontext")
    lines.append(f"    scaler = {'torch.amp.GradScaler(' + repr('cuda') + ')' if precision == 'fp16' else None}")
    if backend:
        lines.append(f"    attention = lambda: sdpa_kernel([SDPBackend.{backend}])")
    else:
        lines.append("    attention = contextlib.nullcontext")
    lines.append("    return model, optimizer, autocast, scaler, attention")
    return "\n".join(lines) + "\n"
