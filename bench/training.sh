#!/usr/bin/env bash
# Training throughput of examples/tiny.par on the CPU backend:
#   * at 8 ranks (its own mapping: tp 2, pp 2, dp 2, every rank a thread of one parrun);
#   * at 1 rank (the same model, train block and global batch with tp = pp = dp = 1);
# tokens/s is the median of parrun's per-step figure over steps 2..N (step 1 also pays for
# first-touch allocation). The GEMM share is the fraction of `perf record` CPU samples of a
# second, profiled run that fall in OpenBLAS's ?gemm_* routines (kernels and packing), out of
# every sample of the process, startup included; it needs `perf` and is "n/a" without it.
#
# Usage: bench/training.sh [--bin DIR] [--steps N] [--keep DIR]
#   --bin DIR    where parc and parrun are (default: build/bin, or $PARC_BIN)
#   --steps N    training steps per run (default 10)
#   --keep DIR   write plans and profiles under DIR and keep them (default: a temporary
#                directory, removed at exit)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${PARC_BIN:-$root/build/bin}
steps=10
keep=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "training.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
for tool in parc parrun; do
  if [[ ! -x $bin/$tool ]]; then
    echo "training.sh: no $tool in '$bin'; build it, or pass --bin DIR" >&2
    exit 2
  fi
done
if [[ $steps -lt 2 ]]; then
  echo "training.sh: --steps must be 2 or more (step 1 is not timed)" >&2
  exit 2
fi

# shellcheck source=bench/common.sh
source "$root/bench/common.sh"
bench_work_dir "$keep"

tiny_one_rank "$work/tiny-1rank.par" training.sh
cp "$root/examples/tiny.par" "$work/tiny-8rank.par"

have_perf=0
if command -v perf > /dev/null && perf record -o "$work/probe.data" -- true > /dev/null 2>&1; then
  have_perf=1
fi

median_tokens() { # LOG -> median tokens/s over steps 2..N
  awk '/^step [0-9]+ loss/ && $2 > 1 { print $NF }' "$1" | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2];
                              else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

gemm_share() { # PERF_DATA -> percent of samples in ?gemm_* routines
  perf report -i "$1" --sort sym --no-children --stdio 2> /dev/null |
    awk '/^ *[0-9.]+%/ { total += $1; if ($0 ~ /[sd]gemm_/) gemm += $1 }
         END { printf "%.1f%%\n", (total > 0 ? 100 * gemm / total : 0) }'
}

printf '%-28s %6s %10s %12s %10s\n' "run" "ranks" "tokens/s" "wall (s)" "GEMM share"
for ranks in 1 8; do
  name=tiny-${ranks}rank
  "$bin/parc" "$work/$name.par" -o "$work/$name" > /dev/null
  start=$(date +%s.%N)
  "$bin/parrun" "$work/$name" --steps "$steps" > "$work/$name.log"
  wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')
  share="n/a"
  if [[ $have_perf -eq 1 ]]; then
    perf record -o "$work/$name.perf" -- "$bin/parrun" "$work/$name" --steps "$steps" \
      > /dev/null 2>&1
    share=$(gemm_share "$work/$name.perf")
  fi
  printf '%-28s %6d %10s %12.1f %10s\n' "tiny.par, $steps steps, fp32" "$ranks" \
    "$(median_tokens "$work/$name.log")" "$wall" "$share"
done
echo "tokens per step: $(awk '/global_batch/ { print $3 }' "$root/examples/tiny.par") sequences" \
  "x $(awk '$1 == "seq" { print $3 }' "$root/examples/tiny.par") tokens;" \
  "$(nproc) CPU cores; OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"
