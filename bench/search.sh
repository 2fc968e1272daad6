#!/usr/bin/env bash
# The search and the step-time model against their speed targets (a table, not a test):
#   * parc --search on GPT-3 175B with every parallel field auto, on 1024 A100s (target: under
#     1 s on 2 cores) and on 16384 (under 5 s), with the candidates it considered and the cost
#     per candidate and per evaluated (feasible) one (target: 10 us);
#   * one mapping in process: its work table and bound (what the search evaluates) and the
#     whole estimate with the simulated schedule (target: 50 us), for the examples;
#   * parc --report=json as a process (target: 5 ms), median of 20 runs, wall and CPU time.
# Usage: bench/search.sh [--parc PATH] [--runs N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
parc=${PARC:-$root/build/bin/parc}
bench=$(dirname "$parc")/parc_cost_bench
runs=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --parc) parc=$2; bench=$(dirname "$parc")/parc_cost_bench; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "search.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
auto() { # every parallel field of gpt3-175b.par auto, on $1 nodes
  sed -e 's/^  tp = 8$/  tp = auto/' -e 's/^  pp = 16$/  pp = auto/' -e 's/^  dp = 8$/  dp = auto/' \
      -e 's/^  order .*/  order = auto/' -e 's/^  micro_batch  = 1$/  micro_batch = auto/' \
      -e 's/^  schedule .*/  schedule = auto/' -e 's/^  zero .*/  zero = auto/' \
      -e 's/^  recompute .*/  recompute = auto/' -e 's/^  sequence_parallel .*/  sequence_parallel = auto/' \
      -e "s/^  nodes         = 128/  nodes = $1/" "$root/examples/gpt3-175b.par"
}
printf '%-28s %10s %9s %9s %10s %12s %12s\n' search candidates feasible "best of" "wall s" "us/cand" "us/feasible"
for nodes in 128 2048; do
  auto $nodes > "$tmp/auto-$nodes.par"
  best=""
  for ((i = 0; i < runs; i++)); do
    start=$(date +%s.%N)
    "$parc" "$tmp/auto-$nodes.par" --search --top=1 --report=json > "$tmp/out.json"
    end=$(date +%s.%N)
    wall=$(echo "$end - $start" | bc -l)
    if [[ -z $best ]] || (( $(echo "$wall < $best" | bc -l) )); then best=$wall; fi
  done
  python3 - "$tmp/out.json" "$best" "$((nodes * 8))" "$runs" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); wall = float(sys.argv[2])
print("%-28s %10d %9d %9s %10.3f %12.2f %12.2f" % (
    "gpt3-175b all auto, %s GPUs" % sys.argv[3], r["candidates"], r["feasible"], sys.argv[4],
    wall, 1e6 * wall / r["candidates"], 1e6 * wall / max(r["feasible"], 1)))
PY
done
echo
"$bench" "$root/examples/tiny.par" "$root/examples/llama2-70b.par" "$root/examples/gpt3-175b.par" \
  "$root/examples/gpt-1.3b.par"
echo
printf '%-44s %12s %12s\n' "parc --report=json as a process" "median ms" "median cpu ms"
for f in tiny llama2-70b gpt3-175b gpt-1.3b; do
  python3 - "$parc" "$root/examples/$f.par" <<'PY'
import resource, subprocess, sys, time
# Wall time is what a user waits; CPU time (the child's user + system) is what a shared,
# loaded machine leaves comparable between runs.
ts, cpus = [], []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.argv[1], sys.argv[2], "--report=json"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    ts.append(time.perf_counter() - t)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
ts.sort()
cpus.sort()
print("%-44s %12.2f %12.2f" % (sys.argv[2].split("/")[-1], 1000 * ts[len(ts) // 2],
                               1000 * cpus[len(cpus) // 2]))
PY
done
