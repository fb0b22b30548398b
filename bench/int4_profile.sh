#!/usr/bin/env bash
# Profile the packed int4 GEMM's winners of an int4_roofline run with ncu (achieved bandwidth, occupancy,
# stall reasons): bench/int4_profile.sh RESULTS.json OUT_DIR
set -euo pipefail
results=$1
out=$2
mkdir -p "$out"
python - "$results" <<'PY' > "$out/cases.txt"
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["shapes"]:
    if e["n"] == 4096 and e["best_packed"] and (e["bits"], e["m"]) in ((4, 1), (4, 16), (4, 64), (8, 1)):
        case = {"m": e["m"], "n": e["n"], "k": e["k"], "bits": e["bits"], "config": e["best_packed"]["config"]}
        print(json.dumps(case))
PY
while read -r case; do
  name=$(python -c "import json,sys; c=json.loads(sys.argv[1]); print(f\"int{c['bits']}-m{c['m']}-{c['n']}x{c['k']}\")" "$case")
  ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section LaunchStats --launch-skip 3 --launch-count 1 -k regex:packed_quant \
      python bench/profile_kernel.py quant "$case" > "$out/ncu-$name.txt" 2>&1 || echo "ncu failed for $name" >&2
done < "$out/cases.txt"
