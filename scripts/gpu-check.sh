#!/usr/bin/env bash
# gpu-check.sh - issue 6's checks of the CUDA backend, on a GPU machine, from .gpu-bundle.
#
#   scripts/gpu-check.sh [--dry-run] [--budget SECONDS] [--bundle DIR] [--glibc=auto|bundled|system]
#
# Runs from the repository root with the bundle of scripts/gpu-bundle.sh (built elsewhere:
# the GPU machine has no LLVM, ANTLR, MPI or OpenBLAS to build parc and parrun with). It finds
# the CUDA libraries of the machine (toolkit, or the nvidia-* wheels of its python), checks that
# every bundled binary resolves, then runs, each under a time limit cut to what is left of the
# budget (default 480 s):
#   (a) the CUDA GoogleTest suites (a skip counts as not passed: this machine has a GPU);
#   (b) the equivalence sweep on the in-process GPU communicator, fp32: every mapping's losses
#       within 1e-5 of the single-rank GPU run;
#   (c) NCCL at world size 1 against the in-process communicator, losses within 1e-5; then
#       bf16 and fp16 (loss scale 1024) against that fp32 run, within 2e-2 and 1e-2;
#   (d) the ceilings (copy bandwidth, bf16 GEMM) and every kernel against them (target: 2x);
#   (e) the 1.3B GPT in bf16: tokens/s (median of the steps after the first 3) and MFU against
#       the measured GEMM rate and the datasheet's 989 TFLOP/s (target: 40 %), with flash
#       attention (judged) and with the unfused attention (for comparison).
# Logs go to ${OUT:-/tmp/gpu-check} (gtest.log, sweep.log, nccl.log, kernel-bench.log and
# .json, gpt-1.3b.log, gpt-1.3b-unfused.log, summary.txt: 8 files, as many as the device tool
# returns); scratch
# to ${TMPDIR:-/tmp}/parc-gpu-check. The last thing printed is a short table. Exit status: 0
# when every check passed (a missed performance target, MISS, does not fail the run), 1 when a
# check failed or there is no CUDA device, 2 when the bundle is incomplete or does not resolve.
#
# --dry-run (for a machine without a GPU) stops after checking that the bundle is complete,
# that every binary resolves, the non-CUDA libraries from the bundle itself, and that parc
# starts.
#
# The binaries were linked on another image and need its glibc (2.36) and libstdc++. Where the
# machine's are older (--glibc=auto sees a "version ... not found" from ldd), they start through
# the bundle's own loader and C runtime (sysroot/); --glibc=bundled or =system forces either.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=$root/.gpu-bundle
budget=480
dry_run=0
glibc=auto
usage() { echo "usage: scripts/gpu-check.sh [--dry-run] [--budget SECONDS] [--bundle DIR] [--glibc=auto|bundled|system]" >&2; exit 2; }
while (($#)); do
  case $1 in
    --dry-run) dry_run=1 ;;
    --budget) [[ ${2:-} =~ ^[0-9]+$ ]] || usage; budget=$2; shift ;;
    --budget=*) budget=${1#*=}; [[ $budget =~ ^[0-9]+$ ]] || usage ;;
    --bundle) [[ -n ${2:-} ]] || usage; bundle=$(cd "$2" && pwd) || exit 2; shift ;;
    --glibc=auto | --glibc=bundled | --glibc=system) glibc=${1#*=} ;;
    *) usage ;;
  esac
  shift
done
cd "$root" || exit 2
deadline=$((SECONDS + budget))
out=${OUT:-/tmp/gpu-check}
work=${TMPDIR:-/tmp}/parc-gpu-check
mkdir -p "$out" && rm -rf "$work" && mkdir -p "$work/lib" || exit 2
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
die() { local status=$1; shift; note "gpu-check: $*"; exit "$status"; }
plans=$bundle/plans
# shellcheck source=gpu-libraries.sh
source "$root/scripts/gpu-libraries.sh"

#--- the bundle --------------------------------------------------------------------------------
[[ -f $bundle/MANIFEST ]] ||
  die 2 "no bundle at $bundle: run scripts/gpu-bundle.sh where parc builds, and carry .gpu-bundle"
incomplete=0
while read -r size path; do
  if [[ ! -f $bundle/$path || $(stat -c %s "$bundle/$path") != "$size" ]]; then
    note "bundle: $path is missing or not the size MANIFEST gives ($size bytes)"
    incomplete=1
  fi
done < <(sed '1,/^files:/d' "$bundle/MANIFEST")
for required in bin/parrun bin/parc_kernel_bench bin/parc_cuda_kernel_tests \
  bin/parc_cuda_device_tests bin/parc_cuda_flash_tests bin/parc_cuda_comm_tests \
  plans/gpt-1.3b/manifest.json plans/gpt-1.3b.report.json \
  plans/sweep/index.json; do
  [[ -f $bundle/$required ]] || { note "bundle: $required is missing"; incomplete=1; }
done
((incomplete)) && die 2 "the bundle is incomplete: run scripts/gpu-bundle.sh again and carry .gpu-bundle"
note "bundle: $(sed -n 's/^commit: *//p' "$bundle/MANIFEST"), built $(sed -n 's/^date: *//p' "$bundle/MANIFEST"), $(du -sh "$bundle" | cut -f1)"

# Libraries stored compressed for the size limit.
for packed in "$bundle"/lib/*.xz; do
  [[ -e $packed ]] || continue
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$packed" "$work/lib/$(basename "$packed" .xz)" || die 2 "cannot unpack $packed"
done

#--- the machine's CUDA libraries ---------------------------------------------------------------
candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/*/lib
  /usr/lib/x86_64-linux-gnu)
for python in /opt/torch/.venv/bin/python3 python3; do
  command -v "$python" >/dev/null || continue
  mapfile -t -O "${#candidates[@]}" candidates < <("$python" -c '
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for base in nvidia.__path__:
    print("\n".join(sorted(glob.glob(os.path.join(base, "*", "lib")))))' 2>/dev/null)
done
cuda_path=
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  found=
  for dir in "${candidates[@]}"; do
    [[ -n $dir && -e $dir/$lib ]] && { found=$dir; break; }
  done
  note "cuda: $lib: ${found:-not found}"
  [[ -n $found && :$cuda_path: != *:$found:* ]] && cuda_path=$cuda_path:$found
done
for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [[ -d $dir ]] && cuda_path=$cuda_path:$dir
done
# Only the bundled binaries get the bundle's libraries (an older libz or libtinfo must not
# reach the machine's python3 or nvidia-smi): each runs through a wrapper in $work/bin.
ld_path=$work/lib:$bundle/lib$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
sysroot=$bundle/sysroot
loader=$sysroot/ld-linux-x86-64.so.2
# missing_version LDD_OUTPUT: the first symbol version ldd found missing ("GLIBC_2.36"), or
# nothing. ldd fails on such a binary, so its output, not its status, tells.
missing_version() {
  sed -n "s/.*version \`\([^']*\)' not found.*/\1/p" <<<"$1" | head -1
}
if [[ $glibc == auto ]]; then
  glibc=system
  for binary in "$bundle"/bin/*; do
    too_old=$(missing_version "$(LD_LIBRARY_PATH=$ld_path ldd "$binary" 2>&1)")
    if [[ -n $too_old ]]; then
      note "glibc: the machine's is $(ldd --version 2>&1 | head -1 | awk '{ print $NF }'): $(basename "$binary") needs $too_old"
      glibc=bundled
      break
    fi
  done
fi
if [[ $glibc == bundled ]]; then
  [[ -f $loader ]] || die 2 "the bundle has no sysroot/ (an older bundle): run scripts/gpu-bundle.sh again"
  chmod +x "$loader" 2>/dev/null
  ld_path=$sysroot:$ld_path
  note "glibc: the binaries start through the bundle's loader and C runtime ($(sed -n 's/^built: *//p' "$bundle/MANIFEST" | cut -d, -f2 | sed 's/^ *//'))"
fi
# list_libs BINARY: ldd's lines for BINARY as it will start.
list_libs() {
  if [[ $glibc == bundled ]]; then
    "$loader" --library-path "$ld_path" --list "$1" 2>&1
  else
    LD_LIBRARY_PATH=$ld_path ldd "$1" 2>&1
  fi
}
mkdir -p "$work/bin"
for binary in "$bundle"/bin/*; do
  if [[ $glibc == bundled ]]; then
    printf '#!/bin/sh\nexec %q --library-path %q %q "$@"\n' "$loader" "$ld_path" "$binary"
  else
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$ld_path" "$binary"
  fi >"$work/bin/$(basename "$binary")"
  chmod +x "$work/bin/$(basename "$binary")"
done

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 |
    tee -a "$summary"
else
  note "nvidia-smi: not found"
fi

#--- every binary resolves ----------------------------------------------------------------------
unresolved=0
for binary in "$bundle"/bin/*; do
  listing=$(list_libs "$binary")
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $path == not ]]; then
      if [[ $name =~ $cuda_lib ]] && ((dry_run)); then
        note "ldd: $(basename "$binary"): $name not found (a CUDA library: the GPU machine's)"
      else
        note "ldd: MISSING: $(basename "$binary") needs $name, found nowhere"
        unresolved=1
      fi
    elif [[ ! ${name##*/} =~ $system_lib && ! $name =~ $cuda_lib && $path != "$work/lib/"* &&
      $path != "$bundle/lib/"* ]]; then
      # Resolves here, but not from the bundle: the GPU machine may not have it.
      note "ldd: NOT BUNDLED: $(basename "$binary") takes $name from $path"
      ((dry_run)) && unresolved=1
    fi
  done <<<"$listing"
  missing=$(missing_version "$listing")
  if [[ -n $missing ]]; then
    note "ldd: $(basename "$binary") needs $missing, which the C runtime it starts with lacks"
    unresolved=1
  fi
done
((unresolved)) && die 2 "some libraries do not resolve (above); run scripts/gpu-bundle.sh again"
note "ldd: every binary resolves ($glibc glibc)"
started=$("$work/bin/parc" --version 2>&1) || die 2 "parc does not start: $started"
note "start: $started"
# Through the bundle's loader parrun cannot restart itself on the OpenBLAS kernels this CPU
# calls for (OpenBLAS 0.3.21 falls back to Prescott on CPUs it does not know); it names them.
blas_core=$("$work/bin/parrun" --version 2>&1 >/dev/null |
  sed -n 's/.*set OPENBLAS_CORETYPE=\([A-Za-z]*\).*/\1/p')
if [[ -n $blas_core ]]; then
  export OPENBLAS_CORETYPE=$blas_core
  note "blas: OPENBLAS_CORETYPE=$blas_core for the CPU runs (OpenBLAS chose Prescott)"
fi
if ((dry_run)); then
  note "dry run: the bundle is complete and resolves; on a GPU machine run scripts/gpu-check.sh"
  exit 0
fi

bin=$work/bin
if ! probe=$("$bin/parc_kernel_bench" --check-device 2>&1); then
  reason=${probe#parc_kernel_bench: }
  [[ $reason == "no CUDA device"* ]] || reason="no CUDA device: $reason"
  die 1 "$reason; nothing run (scripts/gpu-check.sh --dry-run checks the bundle without a GPU)"
fi
note "$probe"

#--- running the checks -------------------------------------------------------------------------
rows=()
failed=0
row() { # check result target verdict
  rows+=("$(printf '%-28s %-40s %-20s %s' "$1" "$2" "$3" "$4")")
  [[ $4 == FAIL ]] && failed=1
}

# run_step LOG LIMIT COMMAND...: runs COMMAND teed into LOG under LIMIT seconds or what is left
# of the budget; sets step_status (125: not run, budget spent) and step_note.
run_step() {
  local log=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS))
  step_note=
  if ((left < 10)); then
    echo "gpu-check: not run, the ${budget}s budget is spent: $*" | tee -a "$log"
    step_status=125 step_note="not run: budget spent"
    return
  fi
  ((limit > left)) && limit=$left
  echo "\$ $* (limit ${limit}s)" | tee -a "$log"
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
  step_status=${PIPESTATUS[0]}
  if ((step_status == 124 || step_status == 137)); then
    step_note="timed out after ${limit}s"
    echo "gpu-check: $step_note" | tee -a "$log"
  elif ((step_status != 0)); then
    step_note="exit $step_status"
  fi
}

gtest_suite() { # label binary
  local label=$1 binary=$bin/$2 log=$work/$2.log
  if [[ ! -x $binary ]]; then
    row "$label" "not in the bundle" "all pass, 0 skipped" FAIL
    return
  fi
  run_step "$log" 90 "$binary" --gtest_color=no
  cat "$log" >>"$out/gtest.log"
  local passes fails skips
  passes=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log" | tail -1)
  fails=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$log" | tail -1)
  skips=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$log" | tail -1)
  # A test that needs more GPUs than the machine has is skipped for a reason the machine
  # explains; any other skip on a GPU machine means a test did not run.
  local gpus_short
  gpus_short=$(grep -cE '^needs [0-9]+ CUDA devices$' "$log")
  local result="${passes:-0} passed, ${fails:-0} failed, ${skips:-0} skipped"
  ((gpus_short > 0)) && result="$result ($gpus_short need more GPUs)"
  [[ -n $step_note ]] && result="$result ($step_note)"
  if ((step_status == 0 && ${passes:-0} > 0 && ${fails:-0} == 0 && ${skips:-0} == ${gpus_short:-0})); then
    row "$label" "$result" "all pass, 0 skipped" PASS
  else
    row "$label" "$result" "all pass, 0 skipped" FAIL
  fi
}

: >"$out/gtest.log"
gtest_suite "kernel tests (gtest)" parc_cuda_kernel_tests
gtest_suite "device tests (gtest)" parc_cuda_device_tests
gtest_suite "flash attention tests (gtest)" parc_cuda_flash_tests
gtest_suite "comm tests (gtest)" parc_cuda_comm_tests

# (b) the sweep, fp32, every rank a thread on GPU 0.
run_step "$out/sweep.log" 180 python3 test/runtime/sweep.py --run-prepared "$plans/sweep" \
  --parrun "$bin/parrun" --parrun-args "--backend=cuda" --jobs 4
counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out/sweep.log" | tail -1)
largest=$(sed -n 's/^largest loss difference \([^,]*\),.*/\1/p' "$out/sweep.log" | tail -1)
result="${counts:-no summary}${largest:+, max $largest}${step_note:+ ($step_note)}"
if ((step_status == 0)) && [[ $counts == *" 0 failed" ]]; then
  row "sweep: cuda fp32, in-process" "$result" "losses within 1e-5" PASS
else
  row "sweep: cuda fp32, in-process" "$result" "losses within 1e-5" FAIL
fi

# loss_difference A B: the largest relative difference of two 3-step --dump-weights runs'
# losses ("inf" when they are not both 3 steps or cannot be read).
loss_difference() {
  python3 -c '
import json, sys
a, b = (json.load(open(p))["losses"] for p in sys.argv[1:])
print("%.2e" % max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) == 3 else "inf")' \
    "$1" "$2" 2>&1 | tail -1
}
verdict_within() { # difference tolerance
  awk -v d="$1" -v t="$2" 'BEGIN { print ((d ~ /^[0-9.e+-]+$/ && d + 0 <= t + 0) ? "PASS" : "FAIL") }'
}

# (c) NCCL at world size 1 against the in-process communicator, on the sweep's 1-rank plan.
tiny=$plans/sweep/$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["references"][0]["dir"])' "$plans/sweep/index.json")/plans
: >"$out/nccl.log"
nccl_ok=1
for comm in nccl local; do
  run_step "$out/nccl.log" 60 "$bin/parrun" "$tiny" --backend=cuda --comm=$comm --steps 3 \
    --log-every 1 --dump-weights "$work/$comm.json"
  ((step_status == 0)) || { nccl_ok=0; nccl_note="--comm=$comm: ${step_note}"; }
done
if ((nccl_ok)); then
  diff=$(loss_difference "$work/nccl.json" "$work/local.json")
  echo "gpu-check: nccl vs local, largest loss difference $diff" | tee -a "$out/nccl.log"
  verdict=$(verdict_within "$diff" 1e-5)
  row "NCCL world 1 vs in-process" "loss rel diff $diff" "within 1e-5" "$verdict"
else
  row "NCCL world 1 vs in-process" "$nccl_note" "within 1e-5" FAIL
fi

# (c2) bf16 and fp16 against (c)'s fp32 run of the same plan: a broken half-precision path
# shows as losses far apart. fp16 with a static loss scale of 1024, so that no step is skipped.
for half in bf16 fp16; do
  tolerance=$([[ $half == bf16 ]] && echo 2e-2 || echo 1e-2)
  scale_args=()
  [[ $half == fp16 ]] && scale_args=(--loss-scale=1024)
  if [[ ! -f $work/local.json ]]; then
    row "$half vs fp32, 1 rank" "no fp32 run to compare with" "within $tolerance" FAIL
    continue
  fi
  run_step "$out/nccl.log" 60 "$bin/parrun" "$tiny" --backend=cuda --precision=$half --steps 3 \
    --log-every 1 "${scale_args[@]}" --dump-weights "$work/$half.json"
  if ((step_status != 0)); then
    row "$half vs fp32, 1 rank" "$step_note" "within $tolerance" FAIL
    continue
  fi
  diff=$(loss_difference "$work/local.json" "$work/$half.json")
  echo "gpu-check: $half vs fp32, largest loss difference $diff" | tee -a "$out/nccl.log"
  verdict=$(verdict_within "$diff" "$tolerance")
  row "$half vs fp32, 1 rank" "loss rel diff $diff" "within $tolerance" "$verdict"
done

# (d) the ceilings and the kernels; the json is written even when a kernel failed.
rm -f "$out/kernel-bench.json"
run_step "$out/kernel-bench.log" 120 "$bin/parc_kernel_bench" --json "$out/kernel-bench.json"
gemm_peak=
if [[ -f $out/kernel-bench.json ]]; then
  read -r copy gemm_peak judged ok errors worst < <(python3 -c '
import json, sys
bench = json.load(open(sys.argv[1]))
judged = [k for k in bench["kernels"] if k["verdict"] in ("ok", "SLOW")]
ok = sum(k["verdict"] == "ok" for k in judged)
errors = sum(k["verdict"] == "ERROR" for k in bench["kernels"])
worst = min(judged, key=lambda k: k["fraction_of_ceiling"]) if judged else None
print("%.0f" % (bench["copy_bytes_per_s"] / 1e9), "%.6g" % bench["gemm_flops_per_s"], len(judged),
      ok, errors, "%s:%.0f%%" % (worst["name"].split()[0], 100 * worst["fraction_of_ceiling"]) if worst else "-")' \
    "$out/kernel-bench.json")
  row "copy ceiling (2 GiB D2D)" "$copy GB/s (read + write)" "measured" -
  row "bf16 GEMM ceiling 8192^3" "$(awk -v g="$gemm_peak" 'BEGIN { printf "%.0f TFLOP/s", g / 1e12 }')" "datasheet 989" -
  if ((errors > 0)); then
    row "kernels within 2x ceiling" "$ok of $judged, $errors failed (see log)" "all" FAIL
  else
    row "kernels within 2x ceiling" "$ok of $judged; worst $worst" "all" "$([[ $ok == "$judged" ]] && echo PASS || echo MISS)"
  fi
else
  row "kernel bench" "${step_note:-no json written}" "all within 2x" FAIL
fi

# (e) the 1.3B GPT, bf16, one GPU: with flash attention (parrun's default), the run the MFU
# target is judged on, then with the unfused attention for comparison.
gpt_benchmark() { # label log judged [parrun options...]
  local label=$1 log=$2 judged=$3
  shift 3
  run_step "$log" 240 "$bin/parrun" "$plans/gpt-1.3b" --backend=cuda --precision=bf16 \
    --steps 8 --log-every 1 "$@"
  local tokens
  tokens=$(awk '/^step [0-9]+ loss/ && $2 > 3 { for (i = 1; i < NF; ++i) if ($i == "tokens/s") print $(i + 1) }' \
    "$log" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
  if ((step_status != 0)) || [[ -z $tokens ]]; then
    row "1.3B bf16, $label" "${step_note:-no step lines}" "MFU >= 40 %" FAIL
    return
  fi
  local mfu_sheet mfu_gemm
  read -r mfu_sheet mfu_gemm < <(python3 -c '
import json, sys
report = json.load(open(sys.argv[1]))
per_token = report["step_flops"] / report["tokens_per_step"]
tokens = float(sys.argv[2])
gemm = float(sys.argv[3]) if sys.argv[3] else 0
print("%.1f" % (100 * tokens * per_token / 989e12), "%.1f" % (100 * tokens * per_token / gemm) if gemm else "-")' \
    "$plans/gpt-1.3b.report.json" "$tokens" "$gemm_peak")
  row "1.3B bf16 tokens/s, $label" "$tokens (median, steps 4-8)" "" -
  if ((judged)); then
    verdict=$(awk -v m="$mfu_sheet" 'BEGIN { print (m >= 40 ? "PASS" : "MISS") }')
    row "1.3B MFU vs 989 TFLOP/s, $label" "$mfu_sheet %" ">= 40 %" "$verdict"
  else
    row "1.3B MFU vs 989 TFLOP/s, $label" "$mfu_sheet %" "" -
  fi
  row "1.3B MFU vs measured GEMM, $label" "$mfu_gemm %" "" -
  local held model
  held=$(awk '$3 == "held" { print $(NF - 1), $NF; exit }' "$log")
  model=$(awk '$1 == "model" && NF == 11 { print $(NF - 1), $NF; exit }' "$log")
  row "1.3B peak memory, $label" "held ${held:-?}, model ${model:-?}" "" -
}
gpt_benchmark "flash attention" "$out/gpt-1.3b.log" 1
gpt_benchmark "unfused attention" "$out/gpt-1.3b-unfused.log" 0 --attention=unfused

{
  echo
  printf '%-28s %-40s %-20s %s\n' check result target verdict
  printf '%s\n' "${rows[@]}"
  echo "logs in $out; $((SECONDS)) s of the ${budget}s budget used"
} | tee -a "$summary"
exit $failed
