"""Run the GPU benchmark suite in priority order within a time budget, one subprocess per step.

Each step writes its JSON (or JSON Lines) under ``--out-dir``, and every step's output goes to one
``suite.log`` there; a step that would not fit in
what is left of ``--budget-s`` is skipped and listed as such, and a step that overruns is
stopped at the deadline, so a short GPU session still brings back the most important
results. ``suite.json`` records what ran, for how long, and how it ended.

    PYTHONPATH=. python bench/run_suite.py --budget-s 420 --out-dir bench/results/h200

A machine that brings back only a few files (say 8) keeps the JSON of at
most six steps and the two suite files: choose the steps with ``--only``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: (name, seconds it needs at least, command); ``{out}`` is the step's output path.
STEPS: list[tuple[str, float, list[str]]] = [
    (
        "gemm-targets",
        60,
        "bench/gemm_targets.py --targets bf16-8192 fp8-8192 bf16-8192x8192x8191 "
        "--trials 16 --minutes 0.5 --rounds 3 --out {out}.json".split(),
    ),
    (
        "attention",
        45,
        "bench/attention_study.py --shapes s4096-d128-full s4096-d128-causal "
        "--trials 12 --minutes 0.4 --total-minutes 1.3 --rounds 3 --out {out}.json".split(),
    ),
    (
        "quant-gemm",
        45,
        "bench/quant_gemm_study.py --targets int4-m1 int4-m16 --trials 12 --minutes 0.4 --rounds 3 "
        "--out {out}.json".split(),
    ),
    (
        "memory-bound",
        45,
        "bench/memory_bound_study.py --trials 12 --minutes 0.4 --rounds 3 --out {out}.json".split(),
    ),
    ("landscape-gemm", 60, "bench/landscape.py gemm --rep-ms 20 --out {out}.jsonl".split()),
    *(
        (f"landscape-{family}", 60, f"bench/landscape.py {family} --rep-ms 20 --out {{out}}.jsonl".split())
        for family in ("attention", "quant_gemm", "rmsnorm", "softmax", "quant_gemm_m64")
    ),
    (
        "gemm-targets-rest",
        60,
        "bench/gemm_targets.py --targets bf16-4096 fp16-4096 fp16-8192 "
        "--trials 16 --minutes 0.5 --rounds 3 --out {out}.json".split(),
    ),
    (
        "attention-all",
        60,
        "bench/attention_study.py --trials 16 --minutes 0.5 --total-minutes 8 --rounds 2 --out {out}.json".split(),
    ),
    (
        "quant-gemm-all",
        60,
        "bench/quant_gemm_study.py --targets int4-m1 int8-m1 int4-m16 int8-m16 int4-m64 int8-m64 --trials 16 "
        "--minutes 0.35 --rounds 3 --out {out}.json".split(),
    ),
    ("attention-backward", 30, "bench/attention_backward.py --rounds 3 --out {out}.json".split()),
    (
        "train-step",
        120,
        # 4.5 minutes: compiled trials take 30-60 s; 4.5 minutes measured 15 configs (a 10-point front).
        "bench/train_step_study.py --trials 30 --minutes 4.5 --constrained-trials 8 --constrained-minutes 0.8 "
        "--rounds 2 --out {out}.json".split(),
    ),
    # Decode in two steps, each under the 10 minutes of one call: batch 1 first (pretraining and the GPTQ
    # of 4 seed variants, ~260 s on a fresh machine, kept on disk for the second step), then 8 and 64.
    # 20 trials: a study enqueues seeds for a quarter of its trials (5 of the space's 9). 2 minutes:
    # the compiled seeds' first steps take 10-25 s, and 1-minute studies measured 2 configs.
    (
        "decode-step-b1",
        400,
        "bench/decode_step_study.py --batches 1 --trials 20 --minutes 2.0 --rounds 3 --train-steps 300 "
        "--out {out}.json".split(),
    ),
    (
        "decode-step-b8-b64",
        400,
        "bench/decode_step_study.py --batches 8 64 --trials 20 --minutes 2.0 --rounds 3 --train-steps 300 "
        "--out {out}.json".split(),
    ),
    # Two GPUs: NCCL settings per all-reduce size, then a data-parallel step (issue: multi-GPU trials).
    (
        "collective",
        120,
        "bench/collective_study.py --trials 8 --minutes 0.6 --rounds 2 --out {out}.json".split(),
    ),
    ("ddp", 90, "bench/ddp_study.py --trials 10 --minutes 2 --rounds 3 --out {out}.json".split()),
    (
        "gpu-tests-steps",
        30,
        "-m pytest -m gpu -q -p no:cacheprovider --timeout 300 tests/test_train_step.py tests/test_decode_step.py "
        "tests/test_gpt_model.py tests/test_attention_grad.py".split(),
    ),
    (
        "gpu-tests",
        30,
        "-m pytest -m gpu -q -p no:cacheprovider --timeout 120 tests/test_gpu.py tests/test_measure.py "
        "tests/test_attention_kernel.py tests/test_quant_gemm.py tests/test_norm_kernels.py".split(),
    ),
    # Work prepared without a GPU, each first through its GPU tests (killed at their limit: a kernel that hangs
    # costs one step), then measured. Run them with --only, in this order.
    (
        "gpu-tests-quant-ws",
        60,
        "bench/gpu_tests.py --timeout 300 --out {out}.json --what warp-specialized-int4-WIDE_X-PDL-UNSWAPPED-ACT "
        "tests/test_quant_gemm_ws.py tests/test_quant_gemm.py::test_seeds_run_on_gpu_at_the_benchmark_shape".split(),
    ),
    # the 1B products at 64 rows with the WIDE_X and UNSWAPPED tiles offered too (after their GPU tests: AFTER)
    ("decode-shapes-wide", 150, "bench/decode_shapes.py --rows 64 --wide --out {out}.json".split()),
    (
        "gpu-tests-attention-new",
        60,
        "bench/gpu_tests.py --timeout 300 --out {out}.json --what attention-HALF_DIAG-EXP_POLY "
        "tests/test_attention_ws.py::test_gpu_half_diagonal_matches_fp32_attention "
        "tests/test_attention_ws.py::test_gpu_polynomial_exponentials_match_fp32_attention".split(),
    ),
    (
        "gpu-tests-decode-attention",
        60,
        "bench/gpu_tests.py --timeout 240 --out {out}.json --what decode-attention-kernel "
        "tests/test_decode_attention.py tests/test_gpt_model.py".split(),
    ),
    ("decode-attention", 60, "bench/decode_attention.py --out {out}.json".split()),
    # 16-bit split-K partials (PARTIALS=2) and the decode kernel summing qkv's partials: their first GPU checks
    (
        "gpu-tests-partials",
        120,
        "bench/gpu_tests.py --timeout 420 --out {out}.json --what split-K-partials-16-bit-and-in-decode-attention "
        "tests/test_quant_gemm_packed.py::test_gpu_partials_sum_to_the_product tests/test_decode_attention.py "
        "tests/test_decode_step.py::test_decode_on_gpu_split_sums_at_64_rows_keep_the_in_kernel_sums_logits".split(),
    ),
    (
        "decode-b64-parts",
        300,
        "bench/int4_decode.py --batches 64 --seeds 0 --rounds 2 --gen-tokens 64 --names bf16_compiled_flash_pdl "
        "bf16_compiled_flash_pdl_fp8kv int4_packed_compiled_gptq_all int4_packed_compiled_gptq_all_head16 "
        "int4_packed_compiled_gptq_all_fused int4_packed_compiled_gptq_all_fp8kv --out {out}.json".split(),
    ),
    # batch 64 with split-K's sums fused into the next operation (the H100's fastest int4 there), with a bf16 cache
    # and with an fp8 one, against the best bf16 step with each
    (
        "decode-b64-fused",
        240,
        "bench/int4_decode.py --batches 64 --seeds 0 --rounds 2 --gen-tokens 64 --names bf16_compiled_flash_pdl "
        "bf16_compiled_flash_pdl_fp8kv int4_packed_compiled_gptq_all_fused int4_packed_compiled_gptq_all_fused_fp8kv "
        "--out {out}.json".split(),
    ),
    # batches 1, 8 and 64 with the fused sums (their tiles from 32 rows only, as the fastest int4 seed takes them)
    # against `all` with in-kernel sums and the best bf16 step (495 s on an H100)
    (
        "decode-fused-rows",
        500,
        "bench/int4_decode.py --batches 1 8 64 --seeds 0 --rounds 2 --gen-tokens 64 --names bf16_compiled_flash_pdl "
        "int4_packed_compiled_gptq_all int4_packed_compiled_gptq_all_fused --out {out}.json".split(),
    ),
    # batch 64 with split-K's partials stored in bf16 (split_sums: fused16, half the bytes between the product and
    # the operation that sums them) against fp32 partials and the best bf16 step, with a bf16 cache and an fp8 one
    (
        "decode-b64-fused16",
        300,
        "bench/int4_decode.py --batches 64 --seeds 0 --rounds 2 --gen-tokens 64 --names bf16_compiled_flash_pdl "
        "int4_packed_compiled_gptq_all_fused int4_packed_compiled_gptq_all_fused16 bf16_compiled_flash_pdl_fp8kv "
        "int4_packed_compiled_gptq_all_fused16_fp8kv --out {out}.json".split(),
    ),
    # batch 64 on the second weight set (batches 1 and 8 of it are measured; below 32 rows `all`, `fused` and
    # `fused16` run the same kernels), fp32 and 16-bit partials against the best bf16 step
    (
        "decode-b64-seed1",
        240,
        "bench/int4_decode.py --batches 64 --seeds 1 --rounds 2 --gen-tokens 64 --names bf16_compiled_flash_pdl "
        "int4_packed_compiled_gptq_all_fused int4_packed_compiled_gptq_all_fused16 --out {out}.json".split(),
    ),
    (
        "decode-head-shapes",
        120,
        "bench/decode_shapes.py --rows 1 8 64 --shapes lm_head --bits 8 --out {out}.json".split(),
    ),
    ("int4-pdl", 90, "bench/int4_pdl.py --rows 8 64 --out {out}.json".split()),
    (
        "attention-half-diag",
        90,
        "bench/attention_ws.py half_diag --seq 1024 2048 4096 --head-dims 64 --out {out}.json".split(),
    ),
    # SUM_MMA (the rows' sums by a wgmma) beside the S <= 2048 winners (95 s on an H100 for the four S = 1024 shapes)
    (
        "gpu-tests-attention-sum-mma",
        90,
        "bench/gpu_tests.py --timeout 600 --out {out}.json --what attention-SUM_MMA "
        "tests/test_attention_ws.py::test_gpu_row_sums_by_wgmma_match_fp32_attention".split(),
    ),
    (
        "attention-sum-mma",
        200,
        "bench/attention_ws.py sum_mma --seq 1024 2048 --head-dims 64 128 --no-check --out {out}.json".split(),
    ),
    # STREAM_KV (the persistent grid's last round dealt out by key blocks) beside the S <= 2048 winners
    (
        "gpu-tests-attention-stream-kv",
        120,
        "bench/gpu_tests.py --timeout 300 --out {out}.json --what attention-STREAM_KV "
        "tests/test_attention_ws.py::test_gpu_streamed_last_round_matches_fp32_attention".split(),
    ),
    (
        "attention-stream-kv",
        220,
        "bench/attention_ws.py stream_kv --seq 1024 2048 --head-dims 64 128 --no-check --out {out}.json".split(),
    ),
    # Q_BUFFERS=2 (the next tile's Q loaded while this one runs) beside the S <= 2048 winners, at D = 64 with three
    # stages and the quad epilogue too (cuDNN's 134 KiB of shared memory there)
    (
        "gpu-tests-attention-q-buffers",
        120,
        "bench/gpu_tests.py --timeout 300 --out {out}.json --what attention-Q_BUFFERS "
        "tests/test_attention_ws.py::test_gpu_double_buffered_q_matches_fp32_attention".split(),
    ),
    (
        "attention-q-buffers",
        240,
        "bench/attention_ws.py q_buffers --seq 1024 2048 --head-dims 64 128 --no-check --out {out}.json".split(),
    ),
    # LPT_HEADS (each persistent program's tiles from a longest-first table) beside the causal S <= 2048 winners (the
    # GPU test compiles about 45 configs; STREAM_KV's, 6 parametrizations of up to 6 configs, took 114 s on an H100)
    (
        "gpu-tests-attention-lpt",
        180,
        "bench/gpu_tests.py --timeout 400 --out {out}.json --what attention-LPT_HEADS "
        "tests/test_attention_ws.py::test_gpu_longest_first_schedule_matches_fp32_attention".split(),
    ),
    (
        "attention-lpt",
        200,
        "bench/attention_ws.py lpt --seq 1024 2048 --head-dims 64 128 --no-check --out {out}.json".split(),
    ),
    # LPT_HEADS 0 / 16 / 32 x HALF_DIAG x SUM_MMA at D = 64 causal, every config re-measured, numerics checked
    # first (82 s on an H100 with two LPT values)
    (
        "attention-lpt-combo",
        240,
        "bench/attention_ws.py lpt_combo --seq 1024 2048 --head-dims 64 --time-all --out {out}.json".split(),
    ),
    # groups of 0 / 16 / 32 heads x HALF_DIAG at D = 64 causal S 4096 / 8192 (30 s on an H100 for 12 configs)
    (
        "attention-lpt-long",
        90,
        "bench/attention_ws.py lpt_long --seq 4096 8192 --head-dims 64 --time-all --out {out}.json".split(),
    ),
    # a launch's host time beside its GPU time (CUDA events, and a CUDA graph), the Gluon kernel against cuDNN
    ("attention-host", 60, "bench/attention_host.py --out {out}.json".split()),
    # D = 64 full attention: two / three stages x SUM_MMA x Q_BUFFERS, every config re-measured (84 s on an H100)
    (
        "attention-full-combo",
        120,
        "bench/attention_ws.py full_combo --seq 1024 2048 --head-dims 64 --time-all --rounds 7 "
        "--out {out}.json".split(),
    ),
    (
        "attention-exp-poly",
        90,
        "bench/attention_ws.py exp_poly --seq 1024 2048 --head-dims 64 --out {out}.json".split(),
    ),
    (
        "decode-profile-prepared",
        150,
        "bench/decode_profile.py --batches 1 --names bf16_compiled bf16_compiled_flash_pdl int4_packed_compiled_gptq "
        "int4_packed_compiled_gptq_all --out {out}.json".split(),
    ),
    # where the batch-64 gap lies, kernel by kind (the int8 head, the split-K sums or the GEMMs)
    (
        "decode-profile-b64",
        150,
        "bench/decode_profile.py --batches 64 --names bf16_compiled_flash_pdl int4_packed_compiled_gptq_all "
        "int4_packed_compiled_gptq_all_head16 int4_packed_compiled_gptq_all_fused --out {out}.json".split(),
    ),
    # the M = 64 targets with K a compile-time constant of the packed kernel (ptxas no longer serializes the
    # two-warpgroup split-K tiles' wgmmas; 225 s on an H100 for the three shapes)
    (
        "int4-m64",
        240,
        "bench/int4_roofline.py --workers 16 --ms 64 --bits 4 --rounds 7 --out {out}.json".split(),
    ),
    (
        "int4-ws-pdl",
        120,  # 55 s on an H100 (int4-roofline-ws-pdl-int8-h100.json)
        "bench/int4_ws.py --ms 1,64 --bits 4,8 --pdl --prior bench/results/int4-roofline-xtma-h200.json "
        "--out {out}.json".split(),
    ),
    # issue 13's bf16 / fp16 GEMMs: 8192^3, the standing two LLM shapes and three more Llama-8B projections (fused
    # QKV, gate + up, 16384 tokens), each winner picked from the sweep's finalists by 5 interleaved rounds (282 s on
    # an H100 with 8192 x 4096 x 14336 in place of 8192^3)
    (
        "gemm-llm-shapes",
        360,
        "bench/kernel_variants.py --only gemm --top 6 --rounds 15 --gemm-shapes 8192^3 8192x14336x4096 8192x4096x4096 "
        "8192x6144x4096 8192x28672x4096 16384x14336x4096 --precisions bf16 fp16 --out {out}.json".split(),
    ),
    (
        "int4-decode-prepared",
        300,
        "bench/int4_decode.py --batches 1 8 --seeds 0 --gen-tokens 64 --names bf16_compiled bf16_compiled_flash_pdl "
        "int4_packed_compiled_gptq int4_packed_compiled_gptq_all --out {out}.json".split(),
    ),
]


#: Steps that run kernel modes no GPU has run yet, and the GPU tests of those modes: the step runs only once its
#: tests passed, in this run or (``--passed``) an earlier one, so that a mode that hangs or computes garbage does
#: not cost the step's minutes as well.
AFTER: dict[str, str] = {
    "decode-shapes-wide": "gpu-tests-quant-ws",
    "int4-ws-pdl": "gpu-tests-quant-ws",
    # split-K partials read by the decode attention kernel (fused, fused16) and stored in 16 bits (fused16)
    "decode-fused-rows": "gpu-tests-partials",
    "decode-b64-fused16": "gpu-tests-partials",
    "decode-b64-seed1": "gpu-tests-partials",
    "attention-sum-mma": "gpu-tests-attention-sum-mma",
    "attention-stream-kv": "gpu-tests-attention-stream-kv",
    "attention-q-buffers": "gpu-tests-attention-q-buffers",
    "attention-lpt": "gpu-tests-attention-lpt",
    "attention-lpt-combo": "gpu-tests-attention-lpt",
    "attention-lpt-long": "gpu-tests-attention-lpt",
    "attention-host": "gpu-tests-attention-lpt",
}


def blocked_by(name: str, passed: set[str]) -> str | None:
    """Why step ``name`` must not run yet (its tests' step has not passed), or None."""
    tests = AFTER.get(name)
    if tests is None or tests in passed:
        return None
    return f"runs only after {tests} passed (in this run, or say so with --passed {tests})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=420)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--only", nargs="*", help="run only these steps")
    parser.add_argument("--passed", nargs="*", default=[], help="steps that passed in an earlier run (see AFTER)")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    record = []
    passed = set(args.passed)
    for name, needs_s, command in STEPS:
        if args.only and name not in args.only:
            continue
        reason = blocked_by(name, passed)
        if reason:
            record.append({"step": name, "status": "skipped", "reason": reason})
            print(f"== {name}: skipped ({reason})", flush=True)
            continue
        left = deadline - time.monotonic()
        if left < needs_s:
            record.append({"step": name, "status": "skipped", "reason": f"{left:.0f} s left, needs {needs_s:.0f}"})
            print(f"== {name}: skipped ({left:.0f} s left)", flush=True)
            continue
        argv = [sys.executable, *(part.replace("{out}", str(out_dir / name)) for part in command)]
        print(f"== {name} ({left:.0f} s left): {' '.join(argv[1:])}", flush=True)
        start = time.monotonic()
        # One log for the whole suite: a machine that returns only a few files returns the results first.
        with tempfile.TemporaryFile("w+") as log:
            try:
                proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=left, env=os.environ.copy())
                status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                status = "stopped at the deadline"
            log.seek(0)
            text = log.read()
        with (out_dir / "suite.log").open("a") as combined:
            combined.write(f"== {name}: {status}\n{text}\n")
        elapsed = time.monotonic() - start
        tail = text[-1500:]
        print(f"   {status} after {elapsed:.0f} s\n{tail}", flush=True)
        record.append({"step": name, "status": status, "seconds": round(elapsed, 1), "command": argv[1:]})
        if status == "ok":
            passed.add(name)
    (out_dir / "suite.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
