#!/usr/bin/env bash
# The service end to end on a GPU machine: `tuner serve` (API + study runner, local Ray, SQLite),
# one GEMM study submitted over REST, followed to its end, then its export fetched over REST.
# usage: bench/serve_gemm_study.sh OUTDIR [SPEC]   (PYTHONPATH=. or the project installed)
set -euo pipefail
out=${1:?usage: serve_gemm_study.sh OUTDIR [SPEC]}
spec=${2:-examples/gemm-8192.yaml}
mkdir -p "$out"
db="$out/service.db"
port=${PORT:-8000}
url="http://127.0.0.1:$port"
python -m tuner.cli serve --db "$db" --port "$port" > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 60); do curl -sf "$url/healthz" >/dev/null && break; sleep 1; done
curl -s -X POST "$url/api/studies" -H 'Content-Type: application/json' \
  -d "$(python -c 'import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))' "$spec")" \
  | tee "$out/submit.json"; echo
id=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$out/submit.json")
while :; do
  status=$(curl -s "$url/api/studies/$id" | python -c 'import json,sys; d=json.load(sys.stdin); print(d["status"], d["measured"], d["budget_trials"])')
  echo "study $id: $status"
  case "$status" in completed*|stopped*|failed*) break;; esac
  sleep 5
done
curl -s "$url/api/studies/$id" > "$out/study.json"
curl -s "$url/api/studies/$id/pareto" > "$out/pareto.json"
curl -s "$url/api/studies/$id/export?format=json" > "$out/export.json"
curl -s "$url/api/studies/$id/export?format=python" > "$out/export.py"
