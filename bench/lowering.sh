#!/usr/bin/env bash
# Times parc's lowering and plan writer on GPT-3 175B:
#   * examples/gpt3-175b.par (1024 ranks, 192 microbatches, interleaved) to a fresh plan
#     directory and over a previous one (target: under 2 s on a 2-core machine);
#   * bench/gpt3-175b-16k.par (16384 ranks: tp 8, pp 16, dp 128) to a plan directory;
#   * --rank=R alone, which lowers one rank (target: under 50 ms);
# and prints the size of the rank files, by pipeline stage.
#
# Usage: bench/lowering.sh [--parc PATH] [--runs N] [--skip-16k] [--keep DIR]
#   --parc PATH  the parc binary (default: build/bin/parc, or $PARC)
#   --runs N     best of N runs for each timing (default 3; the 16k job runs once)
#   --skip-16k   leave out the 16384-rank job (1.7 GB of plans, about a minute)
#   --keep DIR   write the plan directories under DIR and keep them (default: a temporary
#                directory, removed at exit)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
parc=${PARC:-$root/build/bin/parc}
runs=3
skip16k=0
keep=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --parc) parc=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --skip-16k) skip16k=1; shift ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "lowering.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
if [[ ! -x $parc ]]; then
  echo "lowering.sh: no parc binary at '$parc'; build it, or pass --parc PATH" >&2
  exit 2
fi

if [[ -n $keep ]]; then
  mkdir -p "$keep"
  work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/parc-bench.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi

gpt3=$root/examples/gpt3-175b.par
gpt3_16k=$root/bench/gpt3-175b-16k.par

# Wall-clock milliseconds of one run of "$@", which must succeed.
run_ms() {
  local start end
  start=$(date +%s%N)
  if ! "$@" > /dev/null 2> "$work/stderr"; then
    echo "lowering.sh: failed: $*" >&2
    cat "$work/stderr" >&2
    exit 1
  fi
  end=$(date +%s%N)
  echo $(( (end - start) / 1000000 ))
}

# The best of $1 runs of the rest.
best_ms() {
  local n=$1 best="" ms
  shift
  for ((i = 0; i < n; ++i)); do
    ms=$(run_ms "$@")
    if [[ -z $best || $ms -lt $best ]]; then best=$ms; fi
  done
  echo "$best"
}

rows=()
row() { rows+=("$(printf '%-44s %7s %10s %10s' "$1" "$2" "$3" "$4")"); }
ms_text() { printf '%d.%03d s' $(( $1 / 1000 )) $(( $1 % 1000 )); }

# Plan directories are hundreds of MiB: each timed write starts with the previous ones on
# disk, not still being written back, so that runs compare.
settle() { sync; }

# A fresh directory each run: the first write creates it, later ones would replace it.
fresh_runs() {
  local par=$1 dir=$2 best="" ms
  for ((i = 0; i < runs; ++i)); do
    rm -rf "$dir"
    settle
    ms=$(run_ms "$parc" "$par" -o "$dir")
    if [[ -z $best || $ms -lt $best ]]; then best=$ms; fi
  done
  echo "$best"
}

ms=$(fresh_runs "$gpt3" "$work/gpt3-175b")
row "gpt3-175b.par -o DIR (new directory)" 1024 "$(ms_text "$ms")" "< 2 s"
best=""
for ((i = 0; i < runs; ++i)); do
  settle
  ms=$(run_ms "$parc" "$gpt3" -o "$work/gpt3-175b")
  if [[ -z $best || $ms -lt $best ]]; then best=$ms; fi
done
row "gpt3-175b.par -o DIR (replacing the plans)" 1024 "$(ms_text "$best")" "< 2 s"
for rank in 0 517 1023; do
  ms=$(best_ms "$runs" "$parc" "$gpt3" --rank=$rank)
  row "gpt3-175b.par --rank=$rank" 1024 "$(ms_text "$ms")" "< 50 ms"
done
ms=$(best_ms "$runs" "$parc" "$gpt3" --emit=trace -o "$work/gpt3-175b.json")
row "gpt3-175b.par --emit=trace" 1024 "$(ms_text "$ms")" ""
ms=$(best_ms "$runs" "$parc" "$gpt3" --emit=svg -o "$work/gpt3-175b.svg")
row "gpt3-175b.par --emit=svg" 1024 "$(ms_text "$ms")" ""
dirs=("$work/gpt3-175b")

if [[ $skip16k == 0 ]]; then
  rm -rf "$work/gpt3-175b-16k"
  settle
  ms=$(run_ms "$parc" "$gpt3_16k" -o "$work/gpt3-175b-16k")
  row "gpt3-175b-16k.par -o DIR (new directory)" 16384 "$(ms_text "$ms")" ""
  for rank in 0 16383; do
    ms=$(best_ms "$runs" "$parc" "$gpt3_16k" --rank=$rank)
    row "gpt3-175b-16k.par --rank=$rank" 16384 "$(ms_text "$ms")" "< 50 ms"
  done
  dirs+=("$work/gpt3-175b-16k")
fi

echo "parc: $parc"
echo "machine: $(nproc) cores, $(uname -sr)"
echo
printf '%-44s %7s %10s %10s\n' "case (best of $runs; the 16k job once)" ranks time target
printf '%s\n' "${rows[@]}"
echo

# Rank files by pipeline stage: every rank of a stage holds the same chunks and schedule, so
# its files differ only in a few numbers.
python3 - "${dirs[@]}" <<'PY'
import json, os, statistics, sys

def size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024

for directory in sys.argv[1:]:
    manifest = json.load(open(os.path.join(directory, "manifest.json")))
    by_stage = {}
    sizes = []
    for entry in manifest["ranks"]:
        n = os.path.getsize(os.path.join(directory, entry["file"]))
        sizes.append(n)
        by_stage.setdefault(entry["coords"]["pp"], []).append(n)
    print(f"{os.path.basename(directory)}: {len(sizes)} rank files, {size(sum(sizes))} "
          f"(median {size(statistics.median(sizes))}, largest {size(max(sizes))}); "
          f"manifest.json {size(os.path.getsize(os.path.join(directory, 'manifest.json')))}")
    print(f"  {'stage':>5} {'ranks':>6} {'smallest':>10} {'largest':>10}")
    for stage in sorted(by_stage):
        s = by_stage[stage]
        print(f"  {stage:>5} {len(s):>6} {size(min(s)):>10} {size(max(s)):>10}")
PY
