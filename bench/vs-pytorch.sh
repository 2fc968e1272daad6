#!/usr/bin/env bash
# parrun against PyTorch on the CPU, tokens/s on the same model, batch and optimizer, fp32:
#   * tiny:  examples/tiny.par's model at 1 rank (tp = pp = dp = 1; 8 micro-batches of 2 x 64);
#   * gemm:  a GEMM-heavy GPT (hidden 512, 8 heads, 6 blocks, seq 256, vocab 256, micro-batch
#            8, one micro-batch a step) at 1 rank;
#   * tiny at 8 ranks (tiny.par's own mapping, tp 2 pp 2 dp 2, threads of one parrun) against
#     tiny at 1 rank: the same global batch, so the ratio is what the parallel run costs;
#   * each --par FILE: a model of your own at 1 rank (GPT blocks with layernorm, GELU and
#     learned positions, the head tied to the embedding, AdamW; anything else is refused).
# PyTorch runs bench/vs-pytorch.py (the same blocks, AdamW, clipping, torch.set_num_threads;
# model, batch and optimizer read from parc's plan for the same .par) from a virtual
# environment with torch from PyPI, created on first use. Each run of each side
# gives the median tokens/s of its steps 2..N; the sides alternate run by run (parrun, torch,
# parrun, ...; the 8-rank run right after its 1-rank one) so that the load of a shared machine
# falls on both, and the table shows the median of each side's runs and their spread
# (min-max). A row's ratio is the median of its runs' ratios, each run's two sides one after
# the other: the machine's speed drifts over minutes (a VM's vCPUs move), and a ratio of
# medians taken at different times carries that drift, where a ratio of neighbours cancels it.
#
# Usage: bench/vs-pytorch.sh [--bin DIR] [--steps N] [--runs R] [--threads T] [--venv DIR]
#                            [--only tiny|gemm|ranks|par] [--par FILE]... [--keep DIR]
#                            [--cpu-seconds]
#   --bin DIR     where parc and parrun are (default: build/bin, or $PARC_BIN)
#   --steps N     training steps per run (default 8; step 1 is not counted)
#   --runs R      runs per side and model (default 3)
#   --threads T   threads of each 1-rank side (default 2: torch.set_num_threads, parrun --threads)
#   --venv DIR    the virtual environment with torch (default ~/.cache/parc-bench-venv)
#   --only WHAT   one row only (par: the --par rows only)
#   --par FILE    also compare this .par's model at 1 rank (its mapping must be tp = pp = dp = 1)
#   --keep DIR    keep plans and logs under DIR (default: a temporary directory)
#   --cpu-seconds tokens per CPU-second instead of per second, for a machine that others load:
#                 each run is a 2-step and an N-step launch, and its figure (N - 2) steps'
#                 tokens over the difference of their user + sys seconds (start-up cancels;
#                 a run whose difference is not positive is left out, so give enough steps:
#                 PyTorch's import varies by a few tenths of a second).
#                 Meant for --threads 1 (threads that wait count CPU time); no 8-rank row
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${PARC_BIN:-$root/build/bin}
steps=8
runs=3
threads=2
venv=${PARC_BENCH_VENV:-$HOME/.cache/parc-bench-venv}
only=""
pars=()
keep=""
cpu_seconds=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --cpu-seconds) cpu_seconds=1; shift ;;
    --par) pars+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "vs-pytorch.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
for tool in parc parrun; do
  if [[ ! -x $bin/$tool ]]; then
    echo "vs-pytorch.sh: no $tool in '$bin'; build it, or pass --bin DIR" >&2
    exit 2
  fi
done
if [[ $steps -lt 2 || $runs -lt 1 || ( $cpu_seconds == 1 && $steps -lt 3 ) ]]; then
  echo "vs-pytorch.sh: --steps must be 2 or more (3 with --cpu-seconds) and --runs 1 or more" >&2
  exit 2
fi
case $only in ""|tiny|gemm|ranks|par) ;; *) echo "vs-pytorch.sh: --only tiny, gemm, ranks or par" >&2; exit 2 ;; esac
if [[ $only == par && ${#pars[@]} -eq 0 ]]; then
  echo "vs-pytorch.sh: --only par needs one or more --par FILE" >&2
  exit 2
fi
for par in "${pars[@]}"; do
  if [[ ! -f $par ]]; then
    echo "vs-pytorch.sh: no file '$par' (--par)" >&2
    exit 2
  fi
done
if [[ $cpu_seconds == 1 && $only == ranks ]]; then
  echo "vs-pytorch.sh: --cpu-seconds has no 8-rank row" >&2
  exit 2
fi

if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import torch' 2> /dev/null; then
  echo "vs-pytorch.sh: installing torch into $venv (once)" >&2
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install --quiet torch >&2; then
    echo "vs-pytorch.sh: pip could not install torch into $venv" >&2
    exit 2
  fi
fi
python=$venv/bin/python
# torch warns at import when numpy is absent; the venv has none and nothing here uses it.
export PYTHONWARNINGS="ignore:Failed to initialize NumPy"

# shellcheck source=bench/common.sh
source "$root/bench/common.sh"
bench_work_dir "$keep"

# tiny at 1 rank (bench/common.sh).
tiny_one_rank "$work/tiny.par" vs-pytorch.sh
cp "$root/examples/tiny.par" "$work/tiny-8rank.par"
cat > "$work/gemm.par" <<'PAR'
# The GEMM-heavy model of bench/vs-pytorch.sh: hidden 512, 8 heads, 6 blocks, seq 256.
model gemm_gpt {
  dtype  = fp32
  vocab  = 256
  seq    = 256
  hidden = 512
  heads  = 8
  ffn    = 4 * hidden

  layer embed : embedding
  layer block : transformer x 6
  layer head  : lm_head tied(embed)
}

cluster one_cpu {
  nodes         = 1
  gpus_per_node = 1
  gpu { memory = 8 GiB; flops = 100 GFLOPS }
  intra_node { bandwidth = 10 GB/s; latency = 2 us }
  inter_node { bandwidth = 10 GB/s; latency = 2 us }
}

parallel for gemm_gpt on one_cpu {
  tp = 1
  pp = 1
  dp = 1
  micro_batch  = 8
  global_batch = 8
  schedule     = 1f1b
  zero         = 0
  recompute    = none
}

train {
  optimizer = adam
  lr        = 1e-3
  steps     = 20
  seed      = 1234
}
PAR

median() { # [FORMAT of an even count's mean of the middle two, default %.0f]
  sort -n | awk -v f="${1:-%.0f}" '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2];
                                                    else printf f "\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
parrun_tokens() { # LOG -> median tokens/s over steps 2..N
  awk '/^step [0-9]+ loss/ && $2 > 1 { print $NF }' "$1" | median
}
torch_tokens() { # LOG TOKENS_PER_STEP -> median tokens/s over steps 2..N
  awk -v t="$2" '/^step [0-9]+ seconds/ && $2 > 1 { printf "%.0f\n", t / $4 }' "$1" | median
}

# A parrun from before --threads (a baseline build) takes its threads from OpenBLAS instead.
has_threads=$("$bin/parrun" --help 2>&1 | grep -c -- '--threads=' || true)
launch_parrun() { # NAME STEPS LOG
  if [[ $has_threads -gt 0 ]]; then
    "$bin/parrun" "$work/$1" --steps "$2" --threads "$threads" > "$3"
  else
    OPENBLAS_NUM_THREADS=$threads "$bin/parrun" "$work/$1" --steps "$2" > "$3"
  fi
}
launch_torch() { # NAME STEPS LOG
  "$python" "$root/bench/vs-pytorch.py" --plan "$work/$1" --steps "$2" --threads "$threads" > "$3"
}
declare -A tokens_per_step
step_tokens() { echo "${tokens_per_step[$1]}"; }
per_cpu_second() { # SIDE NAME RUN -> tokens per CPU-second of steps 3..N
  local log=$work/$2.$1.$3 TIMEFORMAT='%3U %3S' short long
  { time "launch_$1" "$2" 2 "$log.short.log" 2>> "$log.err"; } 2> "$log.short.time"
  { time "launch_$1" "$2" "$steps" "$log.log" 2>> "$log.err"; } 2> "$log.time"
  short=$(awk '{ print $1 + $2 }' "$log.short.time")
  long=$(awk '{ print $1 + $2 }' "$log.time")
  awk -v n=$((steps - 2)) -v t="$(step_tokens "$2")" -v a="$short" -v b="$long" \
    'BEGIN { if (b > a) printf "%.0f\n", n * t / (b - a) }'
}
run_parrun() { # NAME RUN -> prints tokens/s (or per CPU-second)
  if [[ $cpu_seconds == 1 ]]; then
    per_cpu_second parrun "$1" "$2"
    return
  fi
  launch_parrun "$1" "$steps" "$work/$1.parrun.$2.log"
  parrun_tokens "$work/$1.parrun.$2.log"
}
run_torch() { # NAME RUN -> prints tokens/s (or per CPU-second)
  if [[ $cpu_seconds == 1 ]]; then
    per_cpu_second torch "$1" "$2"
    return
  fi
  launch_torch "$1" "$steps" "$work/$1.torch.$2.log"
  torch_tokens "$work/$1.torch.$2.log" "$(step_tokens "$1")"
}

# Whether a row runs: all without --only, else the one it names (par: the --par rows).
row_on() { [[ -z $only || $only == "$1" ]]; }

names=(tiny tiny-8rank gemm)
declare -A source=([tiny]=tiny.par [tiny-8rank]=tiny.par [gemm]=gemm.par)
for ((i = 0; i < ${#pars[@]}; ++i)); do
  cp "${pars[$i]}" "$work/par$i.par"
  names+=("par$i")
  source[par$i]=${pars[$i]}
done
for name in "${names[@]}"; do
  if ! "$bin/parc" "$work/$name.par" -o "$work/$name" > "$work/$name.parc.log" 2>&1; then
    cat "$work/$name.parc.log" >&2
    echo "vs-pytorch.sh: parc could not compile ${source[$name]}" >&2
    exit 2
  fi
  # Checks that the PyTorch side models the plan (it names what it does not) and counts tokens,
  # for the models whose PyTorch side runs (par0, par1, ... are the par row's).
  [[ $name == tiny-8rank ]] && continue
  row_on "${name%%[0-9]*}" || continue
  if ! tokens_per_step[$name]=$("$python" "$root/bench/vs-pytorch.py" --plan "$work/$name" --describe); then
    echo "vs-pytorch.sh: cannot compare ${source[$name]} with PyTorch" >&2
    exit 2
  fi
done

declare -A results
# A cache line's round trip between two cores before each run: on a VM it shows whether the
# hypervisor has placed the two vCPUs apart, which slows every 2-thread side (docs/runtime.md).
latencies=()
core_ns() { # -> the round trip in ns, or nothing without the probe
  [[ -x $bin/parc_cpu_core_latency ]] || return 0
  "$bin/parc_cpu_core_latency" 2> /dev/null | awk '{ print $1 }' || true
}
probe_cores() {
  local ns
  ns=$(core_ns)
  if [[ -n $ns ]]; then latencies+=("$ns"); fi
}
# A row's run: both sides' figures, one after the other, and their ratio (none where a side
# gave no figure, as --cpu-seconds may).
record() { # ROW PARRUN REFERENCE; sets last_ratio
  last_ratio=$(awk -v a="$2" -v b="$3" 'BEGIN { if (a > 0 && b > 0) printf "%.4f", a / b }')
  results[$1.parrun]+="$2 "
  results[$1.reference]+="$3 "
  results[$1.ratios]+="$last_ratio "
}
for ((run = 1; run <= runs; ++run)); do
  probe_cores
  tiny_one=""
  if [[ -z $only || $only == tiny || $only == ranks ]]; then
    tiny_one=$(run_parrun tiny "$run")
  fi
  if [[ $cpu_seconds == 0 && ( -z $only || $only == ranks ) ]]; then
    # Eight rank threads on this machine's cores: parrun sizes the kernel threads itself.
    "$bin/parrun" "$work/tiny-8rank" --steps "$steps" > "$work/tiny-8rank.parrun.$run.log"
    record ranks "$(parrun_tokens "$work/tiny-8rank.parrun.$run.log")" "$tiny_one"
    # The pair's ratio again by where the vCPUs were before and after it: a pair with them
    # apart favours the 8 ranks (the 2-thread side slows, the fibers hardly).
    before=${latencies[-1]:-} after=$(core_ns)
    if [[ -n $before && -n $after ]]; then
      placed=apart
      if [[ $before -le 200 && $after -le 200 ]]; then placed=near; fi
      results[ranks.$placed]+="$last_ratio "
    fi
  fi
  if [[ -z $only || $only == tiny ]]; then
    record tiny "$tiny_one" "$(run_torch tiny "$run")"
  fi
  if [[ -z $only || $only == gemm ]]; then
    gemm_parrun=$(run_parrun gemm "$run")
    record gemm "$gemm_parrun" "$(run_torch gemm "$run")"
  fi
  for ((i = 0; i < ${#pars[@]}; ++i)); do
    row_on par || break
    par_parrun=$(run_parrun "par$i" "$run")
    record "par$i" "$par_parrun" "$(run_torch "par$i" "$run")"
  done
done

summary() { # "v1 v2 ..." -> "median (min-max)"
  local values=($1)
  local med lo hi
  med=$(printf '%s\n' "${values[@]}" | median)
  lo=$(printf '%s\n' "${values[@]}" | sort -n | head -1)
  hi=$(printf '%s\n' "${values[@]}" | sort -n | tail -1)
  echo "$med ($lo-$hi)"
}
ratio() { # "r1 r2 ..." -> their median, "1.02x"
  printf '%s\n' $1 | awk 'NF' | median %.4f | awk '{ if ($1 == "n/a") print; else printf "%.2fx\n", $1 }'
}

unit=tokens/s
[[ $cpu_seconds == 1 ]] && unit=tokens/CPU-s
printf '%-44s %22s %22s %7s\n' "model" "parrun $unit" "reference $unit" "ratio"
row() { # ROW LABEL
  [[ -n ${results[$1.parrun]:-} ]] || return 0
  printf '%-44s %22s %22s %7s\n' "$2" "$(summary "${results[$1.parrun]}")" \
    "$(summary "${results[$1.reference]}")" "$(ratio "${results[$1.ratios]}")"
}
row tiny "tiny.par, 1 rank, $threads threads vs PyTorch"
row gemm "gemm (h512 x6, seq 256, mb 8) vs PyTorch"
for ((i = 0; i < ${#pars[@]}; ++i)); do
  row_on par || break
  row "par$i" "$(basename "${pars[$i]}"), 1 rank, $threads threads vs PyTorch"
done
row ranks "tiny.par, 8 ranks vs 1 rank (parrun)"
if [[ -n ${results[ranks.near]:-}${results[ranks.apart]:-} ]]; then
  count() { printf '%s\n' $1 | awk 'NF' | wc -l; }
  echo "8 ranks vs 1 rank, the runs' ratios by the vCPUs before and after the pair:" \
    "near $(ratio "${results[ranks.near]:-}") (n = $(count "${results[ranks.near]:-}"))," \
    "apart $(ratio "${results[ranks.apart]:-}") (n = $(count "${results[ranks.apart]:-}"))"
fi
how="each the median of steps 2..$steps"
[[ $cpu_seconds == 1 ]] && how="each steps 3..$steps over their CPU seconds"
how+="; ratio: the median of the runs' ratios"
# The GEMM rate parrun reaches depends on the OpenBLAS kernels it runs (docs/runtime.md).
blas=$("$bin/parrun" --version 2>/dev/null | sed -n "s/.*OpenBLAS's \([A-Za-z0-9]*\) kernels.*/\1/p")
if [[ ${#latencies[@]} -gt 0 ]]; then
  apart=$(printf '%s\n' "${latencies[@]}" | awk '$1 > 200' | wc -l)
  echo "core-to-core round trip before each run: $(printf '%s\n' "${latencies[@]}" | sort -n | head -1)-$(printf '%s\n' "${latencies[@]}" | sort -n | tail -1) ns;" \
    "$apart of ${#latencies[@]} runs above 200 ns (two cores apart: every 2-thread side slows)"
fi
echo "medians of $runs runs (min-max), $how; fp32; $(nproc) cores;" \
  "parrun on OpenBLAS's ${blas:-unnamed} kernels;" \
  "torch $("$python" -c 'import torch; print(torch.__version__)'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
