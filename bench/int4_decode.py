"""int4 decode against the best bf16 decode on this GPU: the 1B preset, prompt 512, batches 1, 8 and 64.

Every config runs through the ``decode_step`` workload (``DecodeStep.run``: teacher-forced greedy decode
of ``--gen-tokens`` steps, CUDA events, top-1 agreement with the bf16 model). Per batch, the bf16
candidates (CUDA graph, with and without ``torch.compile``) and the int4 candidates (round-to-nearest,
group 128, block 0 in int8, packed and tiled kernels, with and without compile) are measured in turn
``--rounds`` times (A B C ... A B C ...); the best bf16 and the best int4 config with top-1 agreement >=
0.95 are compared by their median tokens/s. The kernels one eager decode step launches are counted with
``torch.profiler`` for the bf16, tiled int4 and packed int4 models.

The weights are trained ``--train-steps`` steps on the synthetic task first (``models.gpt.pretrain``) for
the margins of a trained model, with two seeds (two independently pretrained weight sets) at batch 1.

    PYTHONPATH=. python bench/int4_decode.py --out bench/results/int4-roofline-decode-h200.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import median, ratio_span, verdict, write_result

BF16 = {"weight_bits": 16, "kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": True}
INT4 = {**BF16, "weight_bits": 4, "group_size": 128, "int8_first_blocks": 1, "quantizer": "rtn"}
#: Everything prepared for the step at once: the decode attention kernel, the int8 head, the fused GELU, PDL.
ALL = {
    **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "attention": "flash_decode",
    "lm_head_bits": 8, "fuse_gelu": True, "pdl": True,
}  # fmt: skip
CANDIDATES: dict[str, dict[str, Any]] = {
    "bf16": {**BF16, "compile": "off"},
    "bf16_compiled": {**BF16, "compile": "default"},
    "int4_packed": {**INT4, "quant_kernel": "packed", "compile": "off"},
    "int4_packed_compiled": {**INT4, "quant_kernel": "packed", "compile": "default"},
    "int4_tiled_compiled": {**INT4, "quant_kernel": "tiled", "compile": "default"},
    # split-K's partial products left to the next operation (PARTIALS tiles; Inductor sums them there)
    "int4_packed_compiled_fused": {**INT4, "quant_kernel": "packed", "compile": "default", "split_sums": "fused"},
    # GPTQ's rounding (models/gptq.py) instead of round-to-nearest: the same kernels, closer to the bf16 model
    "int4_packed_compiled_gptq": {**INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq"},
    "int4_packed_compiled_fused_gptq": {
        **INT4, "quant_kernel": "packed", "compile": "default", "split_sums": "fused", "quantizer": "gptq"
    },
    # every kernel of the compiled step a programmatic dependent of the one before (Inductor's PDL code; the
    # warp-specialized tiles copy their first words before waiting for X)
    "int4_packed_compiled_gptq_pdl": {
        **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "pdl": True
    },
    "bf16_compiled_pdl": {**BF16, "compile": "default", "pdl": True},
    # the decode step's own attention kernel (kernels/attention/decode_attention.py: split over the cache, the cache
    # write
    # fused), with a bf16 cache and with an fp8 one, which it reads as fp8
    "bf16_compiled_flash": {**BF16, "compile": "default", "attention": "flash_decode"},
    "int4_packed_compiled_gptq_flash": {
        **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "attention": "flash_decode"
    },
    # the tied LM head (32000 x 2048, 131 MB in bf16) as an int8 / int4 copy of the embedding
    "int4_packed_compiled_gptq_head8": {
        **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "lm_head_bits": 8
    },
    "int4_packed_compiled_gptq_head4": {
        **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "lm_head_bits": 4
    },
    # the MLP's GELU in the epilogue of its first product (no GELU kernel of its own: 18 fewer a step)
    "int4_packed_compiled_gptq_gelu": {
        **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "fuse_gelu": True
    },
    "int4_packed_compiled_gptq_all": ALL,
    "bf16_compiled_flash_pdl": {**BF16, "compile": "default", "attention": "flash_decode", "pdl": True},
    # batch 64, where `all` ran 0.94x bf16: which of its parts cost there (the int8 head at 64 rows, the split-K
    # sums left in the kernel), and both steps with an fp8 cache, which flash_decode reads at half the bytes
    "int4_packed_compiled_gptq_all_head16": {**ALL, "lm_head_bits": 16},
    "int4_packed_compiled_gptq_all_fused": {**ALL, "split_sums": "fused"},
    "int4_packed_compiled_gptq_all_fp8kv": {**ALL, "kv_dtype": "fp8_e4m3"},
    # `_all_fused` (above: the fastest int4 at batch 64 on an H100,
    # bench/results/int4-roofline-decode-b64-parts-h100.json) with the fp8 cache
    "int4_packed_compiled_gptq_all_fused_fp8kv": {**ALL, "split_sums": "fused", "kv_dtype": "fp8_e4m3"},
    # the same with split-K's partial products stored in bf16 (half the bytes written and read between the product
    # and the operation that sums them)
    "int4_packed_compiled_gptq_all_fused16": {**ALL, "split_sums": "fused16"},
    "int4_packed_compiled_gptq_all_fused16_fp8kv": {**ALL, "split_sums": "fused16", "kv_dtype": "fp8_e4m3"},
    "bf16_compiled_flash_pdl_fp8kv": {
        **BF16, "compile": "default", "attention": "flash_decode", "pdl": True, "kv_dtype": "fp8_e4m3",
    },
    "bf16_compiled_flash_fp8kv": {**BF16, "compile": "default", "attention": "flash_decode", "kv_dtype": "fp8_e4m3"},
    "int4_packed_compiled_gptq_flash_fp8kv": {
        **INT4, "quant_kernel": "packed", "compile": "default", "quantizer": "gptq", "attention": "flash_decode",
        "kv_dtype": "fp8_e4m3",
    },
}
GOALS = {1: 1.5, 8: 1.25, 64: 1.0}


def kernels_per_step(workload: Any, config: dict[str, Any], batch: int) -> dict[str, Any]:
    """CUDA kernels one eager decode step of the config's model launches (torch.profiler): ``total`` and the
    count of each kernel name (the ten most frequent), so that a difference between two models names its kernels."""
    from collections import Counter

    import torch

    from objectives import decode_rules as rules

    bits = int(config["weight_bits"])
    kernel = rules.quant_kernel(config) or "tiled"
    model, _ = workload.models.variant(
        config["attention"],
        bits,
        config.get("group_size"),
        "cuda",
        rules.int8_first_blocks(config),
        rules.quantizer(config),
        kernel,
        rules.lm_head_bits(config),
        rules.fuse_gelu(config),
        rules.pdl(config) and config["attention"] == "flash_decode",
    )
    kv_dtype = torch.float8_e4m3fn if config["kv_dtype"] == "fp8_e4m3" else torch.bfloat16
    kv = model.init_cache(batch, workload.max_len, kv_dtype, "cuda")
    prompt = torch.randint(0, workload.cfg.vocab_size, (batch, 16), device="cuda")
    pos = torch.full((), 16, dtype=torch.long, device="cuda")
    token = torch.zeros((batch, 1), dtype=torch.long, device="cuda")
    with torch.no_grad():
        model.prefill(prompt, kv)
        model.decode(token, kv, pos)  # warm: compiles, scratch buffers
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            model.decode(token, kv, pos)
            torch.cuda.synchronize()
    names = Counter(e.name[:80] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return {"total": sum(names.values()), "by_name": dict(names.most_common(10))}


def measure_batch(batch: int, args: argparse.Namespace, seed: int, names: list[str]) -> dict[str, Any]:
    from objectives.decode_step import DecodeStep
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    workload = DecodeStep(model="1b", prompt_len=args.prompt_len, gen_tokens=args.gen_tokens, batch=batch,
                          seed=seed, train_steps=args.train_steps)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names:
            config = {**CANDIDATES[name], "batch": batch}
            started = time.time()
            result = workload.run(config, device, TrialContext(trial_number=round_))
            runs[name].append({"status": str(result.status), "error": result.error, "metrics": result.metrics,
                               "wall_s": time.time() - started})  # fmt: skip
            print(f"b{batch} s{seed} {name}: {result.metrics.get('tokens_per_s')} {result.error or ''}", flush=True)
    out: dict[str, Any] = {"batch": batch, "seed": seed, "runs": runs, "median_tokens_per_s": {}, "top1": {}}
    for name, rows in runs.items():
        ok = [r["metrics"] for r in rows if r["metrics"].get("tokens_per_s")]
        out["median_tokens_per_s"][name] = median([m["tokens_per_s"] for m in ok]) if ok else None
        out["top1"][name] = median([m.get("top1_agreement", float("nan")) for m in ok]) if ok else None
    if seed == args.seeds[0] and batch == args.batches[0]:  # eager steps (bench/decode_profile.py counts graphs)
        counted = dict.fromkeys(("bf16", "int4_packed", *names))
        configs = {name: CANDIDATES[name] for name in counted}
        configs["int4_tiled"] = {**CANDIDATES["int4_packed"], "quant_kernel": "tiled"}
        out["kernels_per_step"] = {name: _counted(workload, config, batch) for name, config in configs.items()}
    return out


def _counted(workload: Any, config: dict[str, Any], batch: int) -> dict[str, Any]:
    """:func:`kernels_per_step`, or the error that stopped it (the timings already measured are kept)."""
    try:
        return kernels_per_step(workload, config, batch)
    except Exception as exc:  # a count that fails must not lose the batch's timings
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def ratio_range(entry: dict[str, Any], tuned: str, baseline: str) -> list[float] | None:
    """The span of the ratio over the rounds: the int4 pick's slowest round over the bf16 config's fastest, and its
    fastest over bf16's slowest (None without two measured rounds of each)."""
    speeds = {
        name: [r["metrics"]["tokens_per_s"] for r in entry["runs"].get(name, []) if r["metrics"].get("tokens_per_s")]
        for name in (tuned, baseline)
    }
    return ratio_span(speeds[tuned], speeds[baseline], paired=False)


def targets_of(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One target a (batch, weights) entry: the fastest int4 config whose top-1 agreement is >= 0.95 against the
    fastest bf16 config, medians over the rounds, with the ratio's span over the rounds (``ratio_range``)."""
    targets = []
    for e in entries:
        speeds, top1 = e["median_tokens_per_s"], e["top1"]
        bf16, bf16_name = max(((v, k) for k, v in speeds.items() if k.startswith("bf16") and v), default=(None, None))
        int4 = [(v, k) for k, v in speeds.items() if k.startswith("int4") and v and (top1.get(k) or 0) >= 0.95]
        best = max(int4, default=(None, None))
        ratio = best[0] / bf16 if best[0] and bf16 else None
        goal = GOALS.get(e["batch"], 1.0)
        targets.append({
            "target": f"decode 1b prompt 512 batch {e['batch']} (weights seed {e['seed']}): int4 tokens/s >= {goal}x "
                      f"the best bf16 config, top-1 agreement >= 0.95 (int4 pick: {best[1]}, "
                      f"top-1 {top1.get(best[1]) if best[1] else None})",
            "tuned": best[0], "baseline": bf16, "ratio": ratio, "goal": goal, "verdict": verdict(ratio, goal),
            "baseline_config": bf16_name,
            "ratio_range": ratio_range(e, best[1], bf16_name) if best[1] and bf16_name else None,
        })  # fmt: skip
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 64])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    # Four, the workload's case cache (MAX_CASES): no case is rebuilt (and recompiled) between rounds.
    parser.add_argument("--names", nargs="*", default=["bf16", "bf16_compiled", "int4_packed", "int4_packed_compiled"])
    parser.add_argument("--out")
    args = parser.parse_args()
    started = time.time()
    entries = []
    for seed in args.seeds:
        for batch in args.batches if seed == args.seeds[0] else args.batches[:1]:
            entries.append(measure_batch(batch, args, seed, args.names))
            write_result({"what": __doc__.split("\n\n")[0], "wall_s": time.time() - started, "entries": entries,
                          "targets": targets_of(entries)}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
