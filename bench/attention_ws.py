"""The warp-specialized Gluon attention kernel (kernels/attention/attention_ws.py) on this GPU: numerics, a sweep, the
targets.

Phases (each a separate process, so that a kernel that hangs costs one phase's timeout):

- ``check``: outputs and log-sum-exp against an fp32 reference at ragged and even shapes, causal and
  full, D = 64 and 128, for every variant (``OVERLAP``, ``BLOCK_N``, ``NUM_BUFFERS``);
- ``sweep``: every config at the S = 4096 shapes, then the fastest two per (D, causal) at every
  target shape (B*S = 16384, H*D = 2048, S in 1024..8192), re-measured interleaved with SDPA's cuDNN
  and flash backends (``--rounds`` rounds, medians; the baseline is the faster backend).

    PYTHONPATH=. python bench/attention_ws.py check --out bench/results/attention-ws-check-h200.json
    PYTHONPATH=. python bench/attention_ws.py sweep --out bench/results/kernel-variants-attention-ws-h200.json
    PYTHONPATH=. python bench/attention_ws.py persistent \
        --out bench/results/kernel-variants-attention-ws-persistent-h200.json

- ``persistent``: the persistent grid's candidates (:data:`PERSISTENT_CONFIGS`) and the best one-tile config at
  every target shape; the fastest of one round re-measured interleaved with SDPA (``--rounds``);
- ``pingpong``, ``consumers``, ``oneloop``, ``chain``, ``single``, ``epilogue``, ``release``, ``single_vec``,
  ``thread_arrive``, ``release3``, ``warp_arrive``, ``half_diag`` (causal shapes only), ``exp_poly``, ``sum_mma``,
  ``stream_kv``, ``q_buffers``, ``lpt`` (causal shapes only): the same per shape for one variant's candidates beside
  the winners (``chain``, ``epilogue``, ``release``, ``single_vec``, ``thread_arrive``, ``warp_arrive``,
  ``half_diag``, ``exp_poly``, ``sum_mma``, ``stream_kv``, ``q_buffers`` and ``lpt`` also re-measure the best config
  without the variant; ``--head-dims`` keeps those head dims only);
- ``lpt_combo`` (``LPT_HEADS`` x ``HALF_DIAG`` x ``SUM_MMA``), ``lpt_long`` (groups of 0 / 16 / 32 heads at long
  sequences), both causal shapes only, and ``full_combo`` (stages x ``SUM_MMA`` x ``Q_BUFFERS``, full shapes only):
  run with ``--time-all``, which re-measures every config interleaved with SDPA instead of the first round's pick.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from typing import Any

from bench.common import interleaved, median, ratio_span, tflops_measurer, verdict, write_result

CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": bn, "NUM_BUFFERS": nb, "OVERLAP": ov}
    for bn, nb, ov in itertools.product((64, 128), (2, 3), (False, True))
]
SHAPES: list[dict[str, Any]] = [
    {"batch": 16384 // s, "heads": 2048 // d, "seq_len": s, "head_dim": d, "causal": c}
    for d in (128, 64)
    for s in (1024, 2048, 4096, 8192)
    for c in (True, False)
]


def _inputs(batch: int, heads: int, seq_len: int, head_dim: int, seed: int = 0) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(  # type: ignore[return-value]
        torch.randn(batch, heads, seq_len, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
        for _ in range(3)
    )


#: One consumer warpgroup and two programs an SM (cuDNN's 64-row tile; the ``single`` phase ran it before the vector
#: epilogue and RELEASE_K existed) with both, beside the two-consumer winners of the ``release`` phase
#: (``single_vec`` phase; contrast CTAS_PER_SM: the best of the other family is re-measured too).
SINGLE_VEC_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": bn, "NUM_BUFFERS": nb, "OVERLAP": ov, "PERSISTENT": True, "PINGPONG": False, "CONSUMERS": 1,
     "CTAS_PER_SM": 2, "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": rk}
    for (bn, nb, ov), ep, rk in itertools.product(((64, 2, True), (64, 3, True), (128, 2, True), (128, 2, False)),
                                                  (0, 2), (False, True))
] + [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": 2,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": rk}
    for nb, pp, ep, rk in ((2, False, 2, True), (2, True, 2, True), (3, False, 1, False))
]  # fmt: skip


def _arrive_configs(knob: str) -> list[dict[str, Any]]:
    """The winners of the ``release`` and ``single_vec`` phases with and without ``knob`` (a way to free K/V slots)."""
    return [
        {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": c,
         "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": rk, **({"CTAS_PER_SM": 2} if c == 1 else {}), knob: on}
        for (c, nb, pp, ep, rk), on in itertools.product(((2, 2, False, 2, True), (2, 2, True, 2, True),
                                                          (2, 3, False, 1, False), (3, 3, False, 2, True),
                                                          (1, 2, False, 2, True)), (False, True))
    ]  # fmt: skip


#: Every consumer thread arrives on the K/V empty barriers (``THREAD_ARRIVE``: no warpgroup barriers around one
#: thread's arrival) against one thread (``thread_arrive`` phase; contrast THREAD_ARRIVE); lane 0 of each warp in
#: inline PTX (``WARP_ARRIVE``, ``warp_arrive`` phase; contrast WARP_ARRIVE).
THREAD_ARRIVE_CONFIGS: list[dict[str, Any]] = _arrive_configs("THREAD_ARRIVE")
WARP_ARRIVE_CONFIGS: list[dict[str, Any]] = _arrive_configs("WARP_ARRIVE")


#: Three K/V stages with RELEASE_K and the quad epilogue (``EPILOGUE=2``), which fit beside each other at D = 64
#: only, against the two-stage winners (``release3`` phase).
RELEASE3_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": 2,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": rk}
    for nb, pp, ep, rk in ((3, False, 2, True), (3, True, 2, True), (3, False, 1, True), (3, False, 2, False),
                           (3, False, 1, False), (2, False, 2, True), (2, True, 2, True))
]  # fmt: skip


def check(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """max|O - O_ref| / max|O_ref| and max|lse - lse_ref| against fp32 math, per shape and config."""
    import torch

    from kernels.attention.attention_ws import attention_ws

    rows, worst = [], 0.0
    # (4, 16, 1024, 128): more work items than SMs, so persistent programs take several tiles each.
    for (b, h, s, d), causal in itertools.product(((2, 3, 1000, 128), (1, 4, 384, 64), (2, 2, 2048, 128),
                                                   (1, 2, 200, 64), (4, 16, 1024, 128)), (True, False)):  # fmt: skip
        q, k, v = _inputs(b, h, s, d, seed=s)
        scale = 1.0 / math.sqrt(d)
        scores = (q.float() @ k.float().transpose(-1, -2)) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        ref = torch.softmax(scores, -1) @ v.float()
        ref_lse = torch.logsumexp(scores, -1) / math.log(2.0)
        for config in configs:
            if _unusable(d, config):
                continue
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            try:
                out = attention_ws(q, k, v, causal=causal, lse=lse, out=torch.full_like(q, float("nan")), **config)
                torch.cuda.synchronize()
            except Exception as exc:  # a config that does not compile (or launch) here is reported, not timed
                rows.append({"shape": [b, h, s, d], "causal": causal, "config": config, "ok": False,
                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})  # fmt: skip
                print(f"  {b}x{h}x{s}x{d} causal={causal} {config}: {rows[-1]['error']}")
                continue
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            lse_err = (lse - ref_lse).abs().max().item()
            ok = err <= 1e-2 and lse_err <= 1e-2
            worst = max(worst, err)
            rows.append({"shape": [b, h, s, d], "causal": causal, "config": config, "max_rel_error": err,
                         "lse_max_abs_error": lse_err, "ok": ok})  # fmt: skip
            verdict_text = "ok" if ok else "WRONG"
            print(f"  {b}x{h}x{s}x{d} causal={causal} {config}: err {err:.2e} lse {lse_err:.2e} {verdict_text}")
    return {"check": rows, "summary": {"cases": len(rows), "wrong": sum(not r["ok"] for r in rows), "worst": worst}}


def check_in_parallel(configs: list[dict[str, Any]], workers: int = 8) -> list[dict[str, Any]]:
    """:func:`check` with the configs spread over ``workers`` processes: their compiles run at once and land in
    Triton's cache on disk, where the timing that follows finds them (the checks store the log-sum-exp as the timed
    calls do)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if len(configs) <= 1 or workers <= 1:
        return check(configs)["check"]
    with ProcessPoolExecutor(min(workers, len(configs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        return [row for result in pool.map(check, [[c] for c in configs]) for row in result["check"]]


def _unusable(head_dim: int, config: dict[str, Any]) -> str | None:
    """Why the kernel cannot run ``config`` at this head dim (None when it can)."""
    from kernels.attention.attention_ws_rules import check_config

    return check_config(
        head_dim,
        config["BLOCK_N"],
        config["NUM_BUFFERS"],
        "bf16",
        config.get("CONSUMERS", 2),
        config.get("CTAS_PER_SM", 1),
        config.get("EPILOGUE", 0),
        bool(config.get("SUM_MMA", False)),
        config.get("Q_BUFFERS", 1),
    )


def _measurers(shape: dict[str, Any], configs: list[dict[str, Any]]) -> dict[str, Any]:
    """TFLOP/s measurers: each config of the kernel, SDPA cuDNN and SDPA flash, on one shape's inputs."""
    import torch

    from bench.kernel_variants import _sdpa_baselines
    from kernels.attention.attention import attention_flops
    from kernels.attention.attention_ws import attention_ws

    b, h, s, d, causal = (shape[k] for k in ("batch", "heads", "seq_len", "head_dim", "causal"))
    q, k, v = _inputs(b, h, s, d)
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    flops = attention_flops(b, h, s, d, causal)
    measurers: dict[str, Any] = {}
    for i, config in enumerate(configs):
        call = lambda c=config: attention_ws(q, k, v, causal=causal, out=out, lse=lse, **c)  # noqa: E731
        measurers[f"ws{i}"] = tflops_measurer(call, flops)
    measurers.update(_sdpa_baselines(shape))  # SDPA's cuDNN and flash backends, on their own seed-0 inputs
    return measurers


def _target(shape: dict[str, Any], values: dict[str, list[float]], tuned_name: str) -> dict[str, Any]:
    """The target entry of one shape: the tuned config's median against the faster SDPA backend's, from interleaved
    rounds (``values``: TFLOP/s by name), with the per-round ratio's span (``ratio_range``)."""
    d, causal, s = shape["head_dim"], shape["causal"], shape["seq_len"]
    medians = {name: median(v) for name, v in values.items()}
    lib = max((n for n in ("cudnn", "flash") if medians.get(n)), key=lambda n: medians[n])
    tuned, base = medians[tuned_name], medians[lib]
    ratio = tuned / base if tuned and base else None
    goal = 0.95 if d == 128 else 1.0
    span = ratio_span(values[tuned_name], values[lib])
    return {"target": f"attention fwd bf16 S={s} D={d} {'causal' if causal else 'full'} vs SDPA {lib}",
            "tuned": round(tuned, 1), "baseline": round(base, 1), "ratio": None if ratio is None else round(ratio, 4),
            "goal": goal, "verdict": verdict(ratio, goal),
            "ratio_range": [round(r, 4) for r in span] if span else None}  # fmt: skip


def sweep(configs: list[dict[str, Any]], rounds: int, keep: int) -> dict[str, Any]:
    wrong = {json.dumps(r["config"], sort_keys=True) for r in check(configs)["check"] if not r["ok"]}
    configs = [c for c in configs if json.dumps(c, sort_keys=True) not in wrong]  # a wrong kernel is not timed
    picks: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    swept = []
    for shape in (s for s in SHAPES if s["seq_len"] == 4096):
        d, causal = shape["head_dim"], shape["causal"]
        usable = [c for c in configs if not _unusable(d, c)]
        measurers = _measurers(shape, usable)
        values = [(measurers[f"ws{i}"](), c) for i, c in enumerate(usable)]
        values.sort(key=lambda t: -t[0])
        picks[(d, causal)] = [c for _, c in values[:keep]]
        swept.append({"shape": shape, "sweep": [{"tflops": round(t, 1), "config": c} for t, c in values]})
        print(f"  sweep D={d} causal={causal}: " + ", ".join(f"{t:.0f} {c}" for t, c in values[:3]), flush=True)
    targets, measured = [], []
    for shape in SHAPES:
        d, causal = shape["head_dim"], shape["causal"]
        started = time.time()
        measurers = _measurers(shape, picks[(d, causal)])
        values = interleaved(measurers, rounds)
        medians = {name: median(v) for name, v in values.items()}
        best_name = max((n for n in medians if n.startswith("ws")), key=lambda n: medians[n] or 0.0)
        targets.append(_target(shape, values, best_name))
        name, tuned, base, ratio = (targets[-1][k] for k in ("target", "tuned", "baseline", "ratio"))
        measured.append({"shape": shape, "config": picks[(d, causal)][int(best_name[2:])],
                         "medians": {n: round(m, 1) for n, m in medians.items() if m},
                         "samples": values, "seconds": round(time.time() - started, 1)})  # fmt: skip
        print(f"  {name}: {tuned:.1f} vs {base:.1f} = {ratio:.3f} ({targets[-1]['verdict']})", flush=True)
    return {
        "kernel": "kernels/attention/attention_ws.py attention_fwd_ws_kernel (Gluon, warp-specialized)",
        "sweep_at_s4096": swept,
        "attention": measured,
        "targets": targets,
        "summary": {t["target"]: [t["ratio"], t["verdict"]] for t in targets},
    }


def grid_order(rounds: int) -> dict[str, Any]:
    """The winner with its grid head-major (a head's programs together, its K/V shared in L2) against the
    default (one query block of every head together), interleaved with SDPA cuDNN, at the short and long S."""
    best = {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True}
    wrong = [r for r in check([{**best, "HEAD_MAJOR": True}])["check"] if not r["ok"]]
    rows = []
    for shape in (s for s in SHAPES if s["seq_len"] in (1024, 4096) or (s["seq_len"] == 8192 and s["causal"])):
        measurers = _measurers(shape, [best, {**best, "HEAD_MAJOR": True}])
        medians = {n: median(v) for n, v in interleaved(measurers, rounds).items()}
        rows.append({"shape": shape, "medians": {n: round(m, 1) for n, m in medians.items() if m}})
        print(f"  {shape}: " + ", ".join(f"{n} {m:.0f}" for n, m in medians.items() if m), flush=True)
    return {"wrong": wrong, "order": rows, "summary": {"wrong": len(wrong), "shapes": len(rows)}}


#: The persistent grid's candidates (and the best one-tile config, for the same-run comparison).
PERSISTENT_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": False, "PERSISTENT": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, "PERSISTENT": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 4, "OVERLAP": True, "PERSISTENT": True},
]
#: The ping-pong candidates beside the persistent winner (``pingpong`` phase).
PINGPONG_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PINGPONG": True},
]
#: Three consumer warpgroups (192 query rows a program, D = 64 only) beside the two-consumer winners
#: (``consumers`` phase); at D = 128 only the two-consumer configs run.
CONSUMER_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": True},
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True},
    *(
        {"BLOCK_N": bn, "NUM_BUFFERS": nb, "OVERLAP": ov, "PERSISTENT": pe, "PINGPONG": pp, "CONSUMERS": 3}
        for bn, nb, ov, pe, pp in ((128, 3, True, True, False), (128, 3, True, True, True), (128, 2, True, True, False),
                                   (128, 3, False, True, False), (64, 3, True, True, False), (64, 4, True, True, True),
                                   (128, 3, True, False, False), (128, 3, True, False, True))
    ),
]  # fmt: skip
#: One loop over a tile's key blocks (the diagonal's blocks masked behind a branch: one pipeline drain a tile, half
#: the code) against two, for the winners of both consumer counts (``oneloop`` phase).
ONE_LOOP_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": c,
     "ONE_LOOP": one}
    for c, pp, one in itertools.product((2, 3), (False, True), (False, True))
]  # fmt: skip


#: A persistent program's tiles chained into one overlapped stream (``CHAIN``) against the same configs without
#: it, two consumers (and three at D = 64) (``chain`` phase; each shape's best with and without ``CHAIN`` are both
#: re-measured beside SDPA).
CHAIN_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": c,
     "ONE_LOOP": True, "CHAIN": chain}
    for c, nb, pp, chain in ((2, 3, False, False), (2, 3, True, False), (2, 3, False, True), (3, 3, False, False),
                             (3, 3, True, False), (3, 3, False, True))
]  # fmt: skip


#: One consumer warpgroup a program (64 query rows, cuDNN's tile at these shapes) with two or three programs an SM,
#: so that one program's first loads, drain and stores overlap another's wgmmas, beside the two- and three-consumer
#: winners (``single`` phase).
SINGLE_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": bn, "NUM_BUFFERS": nb, "OVERLAP": ov, "PERSISTENT": pe, "PINGPONG": False, "CONSUMERS": 1,
     "CTAS_PER_SM": ctas, "ONE_LOOP": True}
    for bn, nb, ov, pe, ctas in ((64, 2, True, True, 2), (64, 2, True, False, 2), (64, 2, False, True, 2),
                                 (128, 2, True, True, 2), (64, 3, True, True, 2))
] + [
    {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": c,
     "ONE_LOOP": True}
    for c, pp in ((2, False), (2, True), (3, False))
]  # fmt: skip


#: The output stored as 16-byte vectors (``EPILOGUE=1``, a layout conversion in each consumer; ``EPILOGUE=2``, the
#: pieces exchanged within each row's lanes) against the accumulator layout's 4-byte stores, for the persistent
#: winners of both consumer counts and the one-tile program (``epilogue`` phase; each shape's best with and
#: without it are both re-measured beside SDPA).
EPILOGUE_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": pe, "PINGPONG": pp, "CONSUMERS": c,
     "ONE_LOOP": True, "EPILOGUE": ep}
    for (c, nb, pe, pp), ep in itertools.product(((2, 3, True, False), (2, 2, True, False), (2, 2, True, True),
                                                  (2, 2, False, False), (3, 3, True, False)), (0, 1, 2))
]  # fmt: skip (at D = 128 three stages and either epilogue exceed shared memory: _unusable drops them)


#: K and V slots freed by their own barriers (``RELEASE_K``, a K slot after its scores) against both freed after
#: P V, at two and three stages and with the vector epilogues (``release`` phase; contrast RELEASE_K).
RELEASE_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": c,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": rk}
    for (c, nb, pp, ep), rk in itertools.product(((2, 3, False, 0), (2, 2, False, 0), (2, 2, False, 2),
                                                  (2, 2, True, 2), (2, 3, False, 1), (3, 3, False, 2)),
                                                 (False, True))
]  # fmt: skip

#: The causal winners' loops (two consumers, 128-key blocks, no ping-pong) with and without ``HALF_DIAG`` (the first
#: consumer takes the first 64 keys of a tile's diagonal block alone); ``half_diag`` phase, causal shapes only.
HALF_DIAG_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": False, "CONSUMERS": 2,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": rk, "HALF_DIAG": half}
    for (nb, ep, rk), half in itertools.product(((2, 2, True), (3, 0, False), (2, 0, True)), (False, True))
]  # fmt: skip

#: The D = 64 winners' loops (two consumers with two stages, three with three) with 0-4 of every 8 exponentials on
#: the FMA pipe (``EXP_POLY``); ``exp_poly`` phase, contrast: the fastest without it.
EXP_POLY_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": False, "CONSUMERS": c,
     "ONE_LOOP": True, "EPILOGUE": 2, "RELEASE_K": True, "EXP_POLY": poly}
    for (c, nb), poly in itertools.product(((2, 2), (3, 3)), range(5))
]  # fmt: skip


#: The S <= 2048 winners' loops (two consumers; two stages with the vector epilogue, with and without ping-pong, and
#: without it with ``HALF_DIAG``, which changes only causal kernels; three stages without it) with each row's sum of P
#: by the threads or by a 64 x 8 wgmma against ones (``SUM_MMA``); ``sum_mma`` phase, contrast: the fastest config the
#: other way.
SUM_MMA_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": 2,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": True, "HALF_DIAG": half, "SUM_MMA": sums}
    for (nb, pp, ep, half), sums in itertools.product(((2, False, 2, False), (2, True, 2, False), (2, False, 2, True),
                                                       (3, False, 0, False)), (False, True))
]  # fmt: skip


#: The S <= 2048 winners' loops (two consumers, two stages with the vector epilogue with and without ping-pong, three
#: stages without; three consumers with 64-key blocks at D = 64) with the persistent grid's last round dealt out by
#: tiles or by key blocks (``STREAM_KV``); ``stream_kv`` phase, contrast: the fastest config the other way.
STREAM_KV_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": bn, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": c,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": True, "STREAM_KV": stream}
    for (bn, nb, pp, c, ep), stream in itertools.product(((128, 2, False, 2, 2), (128, 2, True, 2, 2),
                                                          (128, 3, False, 2, 0), (64, 2, False, 3, 0)),
                                                         (False, True))
]  # fmt: skip


#: The S <= 2048 winners' loops (two consumers: two stages with the vector epilogue, with and without ping-pong, and
#: at D = 64 three stages with and without it: with two Q buffers, 132 KiB of shared memory, cuDNN's footprint at
#: D = 64) with one or two Q buffers a consumer (``Q_BUFFERS``); ``q_buffers`` phase, contrast: the fastest config
#: the other way.
Q_BUFFERS_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": 2,
     "ONE_LOOP": True, "EPILOGUE": ep, "RELEASE_K": True, "Q_BUFFERS": qb}
    for (nb, pp, ep), qb in itertools.product(((2, False, 2), (2, True, 2), (3, False, 0), (3, False, 2)), (1, 2))
]  # fmt: skip


#: The causal S <= 2048 winners' loops (two consumers: two stages with the vector epilogue, with and without ping-pong,
#: and at D = 64 three stages) with the persistent grid's items in turn (causal pairs) or each program's tiles from a
#: longest-first table by groups of 32 or 64 heads (``LPT_HEADS``); ``lpt`` phase (causal shapes only: full
#: attention's tiles are all the same work), contrast: the fastest config the other way.
LPT_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_N": 128, "NUM_BUFFERS": nb, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": pp, "CONSUMERS": 2,
     "ONE_LOOP": True, "EPILOGUE": 2, "RELEASE_K": True, "LPT_HEADS": heads}
    for (nb, pp), heads in itertools.product(((2, False), (2, True), (3, False)), (0, 32, 64))
]  # fmt: skip


#: The S <= 2048 winners' loop the combination phases start from: persistent, two consumers without ping-pong, two
#: K/V stages, one loop, the vector epilogue, K slots freed after their scores.
WINNER_LOOP: dict[str, Any] = {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, "PERSISTENT": True, "PINGPONG": False,
                               "CONSUMERS": 2, "ONE_LOOP": True, "EPILOGUE": 2, "RELEASE_K": True}  # fmt: skip

#: The D = 64 causal loop (two consumers, two stages, the vector epilogue) with ``LPT_HEADS`` 0 / 16 / 32,
#: ``HALF_DIAG`` and ``SUM_MMA`` in every combination: the three knobs that each gained at S <= 2048 on their own
#: (``lpt_combo`` phase, causal shapes; run with ``--time-all``: first-round single timings of close configs are noise).
LPT_COMBO_CONFIGS: list[dict[str, Any]] = [
    {**WINNER_LOOP, "LPT_HEADS": heads, "HALF_DIAG": half, "SUM_MMA": sums}
    for heads, half, sums in itertools.product((0, 16, 32), (False, True), (False, True))
]  # fmt: skip


#: The same loop at long causal shapes with groups of 0 (the pairs) / 16 / 32 heads, with and without ``HALF_DIAG``
#: (``lpt_long`` phase, S 4096 / 8192 causal; ``--time-all``): whether smaller groups, whose K/V (16 heads: 16 / 32
#: MiB at D = 64) fits the L2 where 32 heads' (32 / 64 MiB) does not, keep the table's balance without its loss there.
LPT_LONG_CONFIGS: list[dict[str, Any]] = [
    {**WINNER_LOOP, "LPT_HEADS": heads, "HALF_DIAG": half}
    for heads, half in itertools.product((0, 16, 32), (False, True))
]  # fmt: skip


#: The D = 64 full-attention loops (two consumers, the vector epilogue, two or three stages) with ``SUM_MMA`` and
#: ``Q_BUFFERS`` in every combination (``full_combo`` phase, full shapes; run with ``--time-all``).
FULL_COMBO_CONFIGS: list[dict[str, Any]] = [
    {**WINNER_LOOP, "NUM_BUFFERS": nb, "SUM_MMA": sums, "Q_BUFFERS": qb}
    for nb, sums, qb in itertools.product((2, 3), (False, True), (1, 2))
]  # fmt: skip


def _knob_on(config: dict[str, Any], knob: str) -> bool:
    """Whether ``config`` sets ``knob`` away from the kernel's default (a contrast phase's two sides: for
    ``Q_BUFFERS`` and ``CTAS_PER_SM``, whose default is 1, 2 is the variant, not any value but 0)."""
    from kernels.attention.attention_ws_rules import KNOBS

    return config.get(knob, KNOBS[knob]) != KNOBS[knob]


def per_shape(configs: list[dict[str, Any]], rounds: int, out: str | None, seq_lens: list[int] | None = None,
              contrast: str | None = None, checked: bool = True, head_dims: list[int] | None = None,
              causal_only: bool = False, time_all: bool = False,
              full_only: bool = False) -> dict[str, Any]:  # fmt: skip
    """At every target shape (or those of ``seq_lens``): one round over ``configs`` picks the fastest, which is
    then re-measured interleaved with SDPA cuDNN and flash (``rounds`` rounds, medians), with ``contrast`` (a knob)
    also the fastest config whose ``contrast`` differs from the first pick's; the faster re-measured median is the
    shape's winner (``time_all``: every config that ran is re-measured). Written after each shape. ``checked``
    False skips the numerics check (when a GPU test of the same configs ran first); ``causal_only`` / ``full_only``
    keep the shapes with / without the mask."""
    rows = check_in_parallel(configs) if checked else []
    wrong = {json.dumps(r["config"], sort_keys=True) for r in rows if not r["ok"]}
    configs = [c for c in configs if json.dumps(c, sort_keys=True) not in wrong]
    result: dict[str, Any] = {"kernel": "kernels/attention/attention_ws.py attention_fwd_ws_kernel "
                                        "(Gluon, warp-specialized)",
                              "checked": checked, "wrong": sorted(wrong), "attention": [], "targets": []}  # fmt: skip
    for shape in SHAPES:
        if (seq_lens and shape["seq_len"] not in seq_lens) or (head_dims and shape["head_dim"] not in head_dims):
            continue
        if (causal_only and not shape["causal"]) or (full_only and shape["causal"]):
            continue
        d = shape["head_dim"]
        usable = [c for c in configs if not _unusable(d, c)]
        measurers = _measurers(shape, usable)
        first = {n: median(v) for n, v in interleaved({n: m for n, m in measurers.items() if n.startswith("ws")},
                                                       1).items()}  # fmt: skip
        best = max(first, key=lambda n: first[n] or 0.0)
        ranked = sorted((n for n in first if first[n]), key=lambda n: first[n], reverse=True)
        timed = [*(ranked if time_all else [best]), "cudnn", "flash"]
        if contrast and not time_all:
            others = [n for n in first if first[n] and _knob_on(usable[int(n[2:])], contrast)
                      != _knob_on(usable[int(best[2:])], contrast)]  # fmt: skip
            timed += [max(others, key=lambda n: first[n])] if others else []
        values = interleaved({n: measurers[n] for n in timed if n in measurers}, rounds)
        medians = {name: median(v) for name, v in values.items()}
        # the winner is the faster of the re-measured configs (the first round's pick, the contrast), by median
        best = max((n for n in medians if n.startswith("ws")), key=lambda n: medians[n] or 0.0)
        result["targets"].append(_target(shape, values, best))
        name, tuned, base, ratio = (result["targets"][-1][k] for k in ("target", "tuned", "baseline", "ratio"))
        result["attention"].append({"shape": shape, "config": usable[int(best[2:])],
                                    "timed_configs": {n: usable[int(n[2:])] for n in timed if n.startswith("ws")},
                                    "first_round": {repr(usable[int(n[2:])]): round(v, 1) for n, v in first.items()
                                                    if v},
                                    "medians": {n: round(m, 1) for n, m in medians.items() if m},
                                    "samples": values})  # fmt: skip
        print(f"  {name}: {tuned:.1f} vs {base:.1f} = {ratio:.3f} ({result['targets'][-1]['verdict']}) "
              f"with {usable[int(best[2:])]}; first round " + ", ".join(f"{v:.0f}" for v in first.values() if v),
              flush=True)  # fmt: skip
        write_result({"benchmark": "warp-specialized attention: per-shape winner", **result}, out)
    result["summary"] = {t["target"]: [t["ratio"], t["verdict"]] for t in result["targets"]}
    return result


#: The per-shape phases: each phase's candidates and its contrast knob (the fastest config whose knob differs from the
#: winner's is re-measured too; None: no contrast).
PER_SHAPE_PHASES: dict[str, tuple[list[dict[str, Any]], str | None]] = {
    "persistent": (PERSISTENT_CONFIGS, None), "pingpong": (PINGPONG_CONFIGS, None),
    "consumers": (CONSUMER_CONFIGS, None), "oneloop": (ONE_LOOP_CONFIGS, None), "chain": (CHAIN_CONFIGS, "CHAIN"),
    "single": (SINGLE_CONFIGS, None), "epilogue": (EPILOGUE_CONFIGS, "EPILOGUE"),
    "release": (RELEASE_CONFIGS, "RELEASE_K"), "single_vec": (SINGLE_VEC_CONFIGS, "CTAS_PER_SM"),
    "thread_arrive": (THREAD_ARRIVE_CONFIGS, "THREAD_ARRIVE"), "release3": (RELEASE3_CONFIGS, None),
    "warp_arrive": (WARP_ARRIVE_CONFIGS, "WARP_ARRIVE"), "half_diag": (HALF_DIAG_CONFIGS, "HALF_DIAG"),
    "exp_poly": (EXP_POLY_CONFIGS, "EXP_POLY"), "sum_mma": (SUM_MMA_CONFIGS, "SUM_MMA"),
    "stream_kv": (STREAM_KV_CONFIGS, "STREAM_KV"), "q_buffers": (Q_BUFFERS_CONFIGS, "Q_BUFFERS"),
    "lpt": (LPT_CONFIGS, "LPT_HEADS"), "lpt_combo": (LPT_COMBO_CONFIGS, "LPT_HEADS"),
    "lpt_long": (LPT_LONG_CONFIGS, "LPT_HEADS"),
    "full_combo": (FULL_COMBO_CONFIGS, "SUM_MMA"),
}  # fmt: skip


#: Phases whose knobs change nothing without the mask: they run the causal shapes only.
CAUSAL_PHASES = ("half_diag", "lpt", "lpt_combo", "lpt_long")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["check", "sweep", "order", *PER_SHAPE_PHASES])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=int, default=2, help="configs per (D, causal) taken to the targets")
    parser.add_argument("--block-n", type=int, nargs="+", default=[64, 128], help="the sweep's BLOCK_N values")
    parser.add_argument("--seq", type=int, nargs="+", help="per-shape phases: only these sequence lengths")
    parser.add_argument("--head-dims", type=int, nargs="+", help="per-shape phases: only these head dims")
    parser.add_argument("--no-check", action="store_true", help="per-shape phases: skip the numerics check")
    parser.add_argument("--time-all", action="store_true", help="per-shape phases: re-measure every config")
    ns = parser.parse_args()
    checked = [c for c in CONFIGS if c["NUM_BUFFERS"] == 2]  # the stage count changes no arithmetic
    swept = [c for c in CONFIGS if c["BLOCK_N"] in ns.block_n]
    if ns.phase == "order":
        result = grid_order(ns.rounds)
    elif ns.phase in PER_SHAPE_PHASES:
        configs, contrast = PER_SHAPE_PHASES[ns.phase]
        result = per_shape(configs, ns.rounds, ns.out, ns.seq, contrast, not ns.no_check, ns.head_dims,
                           causal_only=ns.phase in CAUSAL_PHASES, time_all=ns.time_all,
                           full_only=ns.phase == "full_combo")
    else:
        result = check(checked) if ns.phase == "check" else sweep(swept, ns.rounds, ns.keep)
    write_result({"benchmark": f"warp-specialized attention: {ns.phase}", **result}, ns.out)

if __name__ == "__main__":
    main()
