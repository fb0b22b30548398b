"""Run the GPU-marked tests of some test files and record the outcome with the machine's fingerprint.

    PYTHONPATH=. python bench/gpu_tests.py --out bench/results/gpu-tests-quant-stream-h200.json \
        --what "the packed kernel's STREAM grid" tests/test_quant_gemm_packed.py

The JSON holds pytest's summary line, its exit status and the command, so a GPU result that a CPU
run cannot check (kernels compiled for sm_90 and launched) is on record beside the benchmarks. ``--timeout``
kills the run after that many seconds (a kernel that hangs blocks in the driver, where no pytest plugin can
interrupt it) and records it as timed out, exit status 124, with what pytest printed until then.
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
    parser.add_argument("--timeout", type=float, help="seconds before the run is killed and recorded as timed out")
    parser.add_argument("files", nargs="+", help="test files (or pytest node ids)")
    args = parser.parse_args()
    started = time.time()
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *args.files]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        stdout, stderr, returncode = run.stdout, run.stderr, run.returncode
    except subprocess.TimeoutExpired as exc:  # the child is killed; what it printed so far is kept
        stdout, stderr, returncode = _text(exc.stdout), _text(exc.stderr), 124
    lines = [line for line in stdout.splitlines() if line.strip()]
    print(stdout[-4000:], stderr[-2000:], sep="\n")
    if returncode == 124:
        summary = f"timed out after {args.timeout:g} s (killed); last line: {lines[-1] if lines else ''}"
    else:
        summary = lines[-1] if lines else stderr.strip()[-300:]
    result = {
        "what": args.what,
        "tests": args.files,
        "result": summary,
        "returncode": returncode,
        "wall_s": round(time.time() - started, 1),
        "summary": {"result": summary, "returncode": returncode},
    }
    if returncode:
        result["failures"] = stdout[-6000:]
    write_result(result, args.out)
    sys.exit(returncode)


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


if __name__ == "__main__":
    main()
