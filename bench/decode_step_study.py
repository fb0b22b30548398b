"""Greedy decoding of a ~1B GPT on this GPU: one tuner study per batch size, against the bf16 model.

The ``decode_step`` workload (objectives/decode_step.py) decodes ``--gen-tokens`` tokens after a
``--prompt-len`` prompt with the shared GPT (``models/gpt.py``, preset ``1b``: 18 layers, d_model
2048, 16 heads, vocab 32000, 0.98B parameters; seeded, then trained ``--train-steps`` steps on the
synthetic task, see below) and a KV cache. Knobs: weight bits (bf16 /
int8 / int4 with group 32/64/128, ``models/quant_linear.py``; quantized by round-to-nearest or
GPTQ, ``models/gptq.py``; int4 with its first blocks in int8), KV-cache dtype (bf16 / fp8 e4m3),
attention (sdpa / math), CUDA graphs and ``torch.compile`` of the step. The batch is fixed per
study (the workload's ``batch`` arg): 1, 8 and 64.

For each batch:

1. the baseline, the bf16 model (bf16 weights and cache, sdpa, one decode step replayed as a CUDA
   graph), is measured through the workload (``tuner.workloads.measure.time_fn``, CUDA events) before the study;
2. a study with the engine (Optuna, Ray worker, SQLite), objective ``tokens_per_s`` under the
   constraint ``top1_agreement >= 0.95`` (argmax agreement with the bf16 model, teacher-forced);
3. the baseline, the best int4 trial (highest tokens/s among int4 trials with top-1 agreement
   >= 0.95, else the highest overall) and the study's pick are re-measured interleaved
   (A B C A B C ..., ``--rounds`` times); the ratios of the medians are the results. When the best
   int4 config is compiled, the bf16 model compiled the same way is measured with them, and int4 is
   compared with it: the int4 ratio is then what the weights buy, not what the compiler does. The
   pick is compared with the plain baseline (what a user gets without tuning).

Target (from the workload's issue): at batch 1, int4 weights decode faster than the bf16 model
(ratio of tokens/s > 1.0) with top-1 agreement >= 0.95; the agreement is reported. At batch 8 and
64 the same comparison and the pick's ratio are reported without a target.

Weights: a seeded random GPT predicts almost uniformly (its top two logits a fraction of a unit
apart), so any quantization flips its argmax: int4 agreed on 28-50% of the tokens of the random
model on the H200. The workload's ``train_steps`` arg first trains the model on the synthetic task
of ``models.gpt.synthetic_batch`` (``models.gpt.pretrain``; the weights are kept on disk, so the
driver and every study's worker decode the same ones), which gives its predictions the margins of
a trained model. It is still not a language model: the agreement measured here says how much
quantization disturbs a confident model, not how a real checkpoint fares.

    PYTHONPATH=. python bench/decode_step_study.py --out $OUT/decode-step-h200.json
    PYTHONPATH=. python bench/decode_step_study.py --quick --out $OUT/decode-step-smoke.json   # smoke run
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import interleaved, median, run_study, verdict, write_result

MODEL = "1b"
#: Synthetic pretraining steps before decoding (models.gpt.pretrain; the first and last loss are in the result).
#: On an H200, 100 steps took the loss from 10.79 to 10.43 only; 300 to 8.18, with varied greedy tokens.
TRAIN_STEPS = 300
PROMPT_LEN = 512
#: 64: at batch 1 the agreement is a fraction of GEN_TOKENS positions; 32 made each flip worth 0.031.
GEN_TOKENS = 64
BATCHES: tuple[int, ...] = (1, 8, 64)
TARGET_BATCH = 1
TARGET_RATIO = 1.0
MIN_TOP1 = 0.95
#: The bf16 model as a serving loop would run it: one decode step captured in a CUDA graph.
BASELINE: dict[str, Any] = {
    "weight_bits": 16,
    "kv_dtype": "bf16",
    "attention": "sdpa",
    "cuda_graphs": True,
    "compile": "off",
}
TIMING_NOTE = (
    "every config through DecodeStep.run: tuner.workloads.measure.time_fn (CUDA events, GPU_TIMING) around the "
    "decode loop of gen_tokens teacher-forced steps (a CUDA-graph replay per step with cuda_graphs), "
    "L2 flushed before each loop"
)


def workload_args(batch: int, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": args.model,
        "prompt_len": args.prompt_len,
        "gen_tokens": args.gen_tokens,
        "batch": batch,
        "seed": 0,
        "train_steps": args.train_steps,
    }


def make_spec(batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """The study of one batch size: the default space (batch fixed by the arg), tokens/s under a top-1 floor."""
    return {
        "name": f"decode-{args.model}-b{batch}-p{args.prompt_len}-g{args.gen_tokens}",
        "workload": "decode_step",
        "args": workload_args(batch, args),
        "objectives": [{"metric": "tokens_per_s", "direction": "maximize"}],
        "constraints": [f"top1_agreement >= {MIN_TOP1}"],
        "budget": {"trials": args.trials, "minutes": args.minutes, "trial_timeout_s": 300},
        "sampler": "auto",
        "seed": args.seed,
        "remeasure": {"top_k": 2, "rounds": 2},
    }


def measure_fn(workload: Any, config: dict[str, Any], log: list[dict[str, Any]]) -> Any:
    """A function returning the config's tokens/s as the workload measures it; each result is appended to ``log``."""
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info

    device = device_info()

    def measure() -> float:
        result = workload.run(config, device, TrialContext())
        log.append({"status": result.status.value, "metrics": result.metrics, "error": result.error})
        return result.metrics["tokens_per_s"] if result.ok else float("nan")

    return measure


def _row(trial: Any) -> dict[str, Any] | None:
    return None if trial is None else {"trial": trial.number, "params": trial.params, "metrics": trial.metrics}


def best_int4(study: Any) -> Any | None:
    """The int4 trial with the most tokens/s among those with top-1 agreement >= MIN_TOP1, else the fastest."""
    rows = [t for t in study.ok(weight_bits=4) if t.metrics.get("tokens_per_s") is not None]
    agreeing = [t for t in rows if (t.metrics.get("top1_agreement") or 0.0) >= MIN_TOP1]
    pool = agreeing or rows
    return max(pool, key=lambda t: t.metrics["tokens_per_s"]) if pool else None


def prepare_seeds(workload: Any, device: Any) -> dict[str, float]:
    """GPTQ of the space's GPTQ seeds before the study (kept on disk): one-off preparation, as the
    pretraining is, and not a cost of the study's search. Seeds that differ only in other knobs (compile,
    CUDA graphs) share weights: each set is prepared once. Returns the seconds per set (near 0 once cached)."""
    from tuner.study.space import compile_space

    seconds = {}
    for seed in compile_space(workload.space_document()).seeds:
        if seed.get("quantizer") == "gptq" and workload.static_check(seed, device) is None:
            name = f"int{seed['weight_bits']}-g{seed['group_size']}-int8-first-{seed.get('int8_first_blocks') or 0}"
            if name in seconds:
                continue
            seconds[name] = round(workload.prepare_weights(seed, device), 1)
            print(f"   GPTQ {name}: {seconds[name]} s", flush=True)
    return seconds


def _candidates(int4: Any, pick: Any) -> tuple[dict[str, dict[str, Any]], str]:
    """The configs re-measured interleaved, by name, and the name the best int4 config is compared with (bf16
    compiled the same way when the int4 config is compiled)."""
    candidates: dict[str, dict[str, Any]] = {"baseline_bf16": BASELINE}
    int4_compile = "off" if int4 is None else int4.params.get("compile") or "off"
    int4_base = "baseline_bf16"
    if int4_compile != "off":
        int4_base = "bf16_compiled"
        candidates[int4_base] = {**BASELINE, "compile": int4_compile}
    if int4 is not None:
        candidates["best_int4"] = int4.params
    if pick is not None and pick.params not in candidates.values():
        candidates["pick"] = pick.params
    return candidates, int4_base


def _int4_verdict(ratio: float | None, top1: float | None) -> str:
    """The int4 target: faster than bf16, strictly, and top-1 agreement of at least MIN_TOP1."""
    int4_verdict = verdict(ratio, TARGET_RATIO, strictly=True)
    if int4_verdict == "met" and (top1 is None or top1 < MIN_TOP1):
        int4_verdict = f"missed (top-1 agreement below {MIN_TOP1})"
    return int4_verdict


def _pretrain_loss(workload: Any, steps: int) -> dict[str, Any]:
    losses = workload.pretrain_losses
    return {"steps": steps, "first": losses[0] if losses else None, "last": losses[-1] if losses else None}


def run_batch(batch: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from objectives.decode_step import DecodeStep

    workload = DecodeStep(**workload_args(batch, args))
    baseline_log: list[dict[str, Any]] = []
    baseline_before = measure_fn(workload, BASELINE, baseline_log)()
    print(f"   bf16 baseline {baseline_before:.1f} tokens/s before the study", flush=True)
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    tokens = workload.reference_tokens(batch, device)
    print(
        f"   bf16 greedy tokens: {tokens['distinct']} distinct of {tokens['tokens']}; top-1 margins "
        f"{tokens['top1_margin_logits']}",
        flush=True,
    )
    gptq_s = prepare_seeds(workload, device)
    spec = make_spec(batch, args)
    study = run_study(spec)
    pick = study.summary.best
    int4 = best_int4(study)
    out: dict[str, Any] = {
        "batch": batch,
        "model": args.model,
        "prompt_len": args.prompt_len,
        "gen_tokens": args.gen_tokens,
        "pretrain_loss": _pretrain_loss(workload, args.train_steps),
        "reference_greedy_tokens": tokens,
        "gptq_seconds_before_study": gptq_s,
        "baseline": {"config": BASELINE, "tokens_per_s_before_study": baseline_before, "run": baseline_log[-1]},
        "study": study.describe(),
        "pick": _row(pick),
        "best_int4_in_study": _row(int4),
        "best_in_study": _row(study.best("tokens_per_s")),
    }
    candidates, int4_base = _candidates(int4, pick)
    logs: dict[str, list[dict[str, Any]]] = {name: [] for name in candidates}
    values = interleaved(
        {name: measure_fn(workload, config, logs[name]) for name, config in candidates.items()}, rounds=args.rounds
    )
    medians = {name: median(v) for name, v in values.items()}

    def ratio(name: str, over: str = "baseline_bf16") -> float | None:
        value, base = medians.get(name), medians.get(over)
        return round(value / base, 3) if value and base else None

    def first_ok(name: str) -> dict[str, float]:
        return next((entry["metrics"] for entry in logs.get(name, []) if entry["status"] == "ok"), {})

    int4_metrics = first_ok("best_int4")
    int4_top1 = int4_metrics.get("top1_agreement")
    int4_ratio = ratio("best_int4", int4_base)
    int4_verdict = _int4_verdict(int4_ratio, int4_top1)
    # The pick may be the baseline or the best int4 config: then it was measured under that name.
    pick_name = None if pick is None else next(name for name, config in candidates.items() if config == pick.params)
    out.update(
        interleaved_tokens_per_s=values,
        interleaved_runs=logs,
        medians_tokens_per_s=medians,
        int4_vs_bf16={
            "ratio": int4_ratio,
            "top1_agreement": int4_top1,
            "max_logit_error": int4_metrics.get("max_logit_error"),
            "peak_mem_gb": int4_metrics.get("peak_mem_gb"),
            "bf16_peak_mem_gb": first_ok("baseline_bf16").get("peak_mem_gb"),
            "config": candidates.get("best_int4"),
            "compared_with": {"name": int4_base, "config": candidates[int4_base]},
            "ratio_vs_plain_bf16": ratio("best_int4"),
            "target": f"> {TARGET_RATIO} x bf16 tokens/s with top-1 agreement >= {MIN_TOP1}"
            if batch == TARGET_BATCH
            else "reported (no target at this batch)",
            "verdict": int4_verdict if batch == TARGET_BATCH else f"reported ({int4_verdict})",
        },
        pick_vs_bf16={"ratio": ratio(pick_name) if pick_name else None, "config": candidates.get(pick_name or "")},
    )
    del workload
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    parser.add_argument("--model", default=MODEL, help="preset of models/config.py")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    parser.add_argument("--gen-tokens", type=int, default=GEN_TOKENS)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=0.75, help="budget.minutes of each study")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-measurement rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train-steps", type=int, default=TRAIN_STEPS, help="steps of synthetic pretraining (0: random weights)"
    )
    parser.add_argument("--quick", action="store_true", help="batch 1 only, 5 trials, 0.5 minutes, 1 round")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.trials, args.minutes, args.rounds, args.gen_tokens = [1], 5, 0.5, 1, 16
    started = time.time()
    results: dict[str, Any] = {}
    for batch in args.batches:
        print(f"== batch {batch} ({args.model}, prompt {args.prompt_len}, {args.gen_tokens} tokens)", flush=True)
        r = results[f"b{batch}"] = run_batch(batch, args)
        print(
            f"   int4 vs bf16: ratio {r['int4_vs_bf16']['ratio']} (top-1 {r['int4_vs_bf16']['top1_agreement']}) "
            f"-> {r['int4_vs_bf16']['verdict']}; pick vs bf16: {r['pick_vs_bf16']['ratio']} "
            f"({time.time() - started:.0f} s so far)",
            flush=True,
        )
        done = len(results) == len(args.batches)
        # After every batch: a run stopped at a deadline still leaves the batches it finished.
        write_result(result_document(args, results, started, partial=not done), args.out)


def result_document(args: argparse.Namespace, results: dict[str, Any], started: float, partial: bool) -> dict[str, Any]:
    summary = {
        name: {
            "int4_vs_bf16_ratio": r["int4_vs_bf16"]["ratio"],
            "int4_top1_agreement": r["int4_vs_bf16"]["top1_agreement"],
            "target": r["int4_vs_bf16"]["target"],
            "verdict": r["int4_vs_bf16"]["verdict"],
            "int4_config": r["int4_vs_bf16"]["config"],
            "pick_vs_bf16_ratio": r["pick_vs_bf16"]["ratio"],
            "pick": r["pick_vs_bf16"]["config"],
            "tokens_per_s": r["medians_tokens_per_s"],
        }
        for name, r in results.items()
    }
    document: dict[str, Any] = {
        "benchmark": f"GPT decode ({args.model}) tuned with decode_step vs the bf16 model, per batch size",
        "timing": TIMING_NOTE,
        "wall_s": round(time.time() - started, 1),
        "summary": summary,
        "batches": results,
    }
    if partial:
        document["partial"] = f"batches {', '.join(results)} of {len(args.batches)}: the run stopped before the rest"
    return document


if __name__ == "__main__":
    main()
