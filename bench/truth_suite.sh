#!/usr/bin/env bash
# One GPU session's truth run: the fingerprint, the GPU tests of the stopwatch and the launch plans, then
# bench/truth.py over every case (seeds, or with STUDY=N an N-trial study per case), results under $OUT
# (or bench/results/), profiles tarred. Ends within TRUTH_BUDGET_S seconds (default 540).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
budget=${TRUTH_BUDGET_S:-540}
start=$SECONDS
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
card=$(python -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())")
tests=$(ls tests/test_measure.py tests/test_launch_plans.py 2>/dev/null)
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider $tests 2>&1 | tee "$out/gpu-tests-truth-$card.log" | tail -15
left=$((budget - (SECONDS - start) - 20))
echo "truth.py: $left s left"
timeout "$left" python bench/truth.py --rounds "${ROUNDS:-5}" --configs "${CONFIGS:-3}" ${STUDY:+--study $STUDY} \
  ${ONLY:+--only $ONLY} --profile-dir "$out/prof" --out "$out/truth-$card${SUFFIX:-}.json" 2>&1 | grep -v "^ *\[" \
  | tee "$out/truth-$card${SUFFIX:-}.log"
(cd "$out" && tar czf "truth-profiles-$card${SUFFIX:-}.tgz" prof && rm -rf prof)
echo "done in $((SECONDS - start)) s"
