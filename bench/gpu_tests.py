"""Run the GPU-marked tests of some test files and record the outcome with the machine's fingerprint.

    PYTHONPATH=. python bench/gpu_tests.py --out bench/results/gpu-tests-quant-stream-h200.json \
        --what "the packed kernel's STREAM grid" tests/test_quant_gemm_packed.py

The JSON holds pytest's summary line, its exit status and the command, so a GPU result that a CPU
run cannot check (kernels compiled for sm_90 and launched) is on record beside the benchmarks.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--what", default="", help="what the tests check, in words")
    parser.add_argument("files", nargs="+", help="test files (or pytest node ids)")
    args = parser.parse_args()
    started = time.time()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *args.files],
        capture_output=True,
        text=True,
    )
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    print(run.stdout[-4000:], run.stderr[-2000:], sep="\n")
    summary = lines[-1] if lines else run.stderr.strip()[-300:]
    result = {
        "what": args.what,
        "tests": args.files,
        "result": summary,
        "returncode": run.returncode,
        "wall_s": round(time.time() - started, 1),
        "summary": {"result": summary, "returncode": run.returncode},
    }
    if run.returncode:
        result["failures"] = run.stdout[-6000:]
    write_result(result, args.out)
    sys.exit(run.returncode)


if __name__ == "__main__":
    main()
