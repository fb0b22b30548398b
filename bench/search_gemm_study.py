"""The project's own search on a real GPU: the ``examples/gemm-8192.yaml`` study without seed configs.

Runs the study through the engine with ``warm_start: false`` (no known-good config first) under the
given sampler, and reports the best TFLOP/s found after each trial against a reference best: the
study's seeded best (``--reference``, e.g. the service study's pick in
``bench/results/service-gemm-8192-h200/study.json``). The issue's target is 0.98 of it within 60 trials.

    PYTHONPATH=. python bench/search_gemm_study.py --reference 1312.19 \
        --out bench/results/search-gemm-8192-h200.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import run_study, verdict, write_result
from tuner.study.spec import parse_spec_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("examples/gemm-8192.yaml"))
    parser.add_argument("--sampler", default="auto")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--reference", type=float, required=True, help="the seeded best TFLOP/s to reach 0.98 of")
    parser.add_argument("--out")
    ns = parser.parse_args()
    spec: dict[str, Any] = parse_spec_text(ns.spec.read_text(), str(ns.spec))
    spec.update(name=f"{spec['name']}-{ns.sampler}-no-seeds", warm_start=False, sampler=ns.sampler)
    spec["budget"] = {**spec.get("budget", {}), "trials": ns.trials}
    study = run_study(spec)
    best, curve = 0.0, []
    for trial in sorted(study.trials, key=lambda t: t.number):
        if trial.status == "ok" and trial.duplicate_of is None:
            best = max(best, float(trial.metrics.get("tflops") or 0.0))
        curve.append(round(best, 1))
    reached = next((i + 1 for i, value in enumerate(curve) if value >= 0.98 * ns.reference), None)
    ratio = best / ns.reference if ns.reference else None
    top = study.best("tflops")
    write_result(
        {
            "study": study.describe(),
            "sampler": ns.sampler,
            "reference_tflops": ns.reference,
            "best_so_far_tflops": curve,
            "best": None if top is None else {"trial": top.number, "params": top.params, "metrics": top.metrics},
            "trials_to_0.98_of_reference": reached,
            "targets": [
                {
                    "target": f"GEMM 8192^3 study without seeds ({ns.sampler}), best within {ns.trials} trials "
                    "vs the seeded best",
                    "tuned": round(best, 1),
                    "baseline": ns.reference,
                    "ratio": None if ratio is None else round(ratio, 4),
                    "goal": 0.98,
                    "verdict": verdict(ratio, 0.98),
                }
            ],
            "summary": {"best_tflops": best, "ratio": ratio, "trials_to_0.98": reached},
        },
        ns.out,
    )


if __name__ == "__main__":
    main()
