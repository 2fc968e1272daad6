#!/usr/bin/env bash
# Fuzz the front end (parse + check), the plan reader + verifier and the Hugging Face import
# (--import-hf) with libFuzzer.
#
#   scripts/fuzz.sh [SECONDS] [-- LIBFUZZER-ARGS...]
#       builds build-fuzz/ with clang 14 (configured on first use), seeds the corpora and runs
#       each target for SECONDS (default 60); e.g. `scripts/fuzz.sh 0 -- -runs=1000000` runs
#       10^6 inputs of each instead of a time limit.
#   scripts/fuzz.sh --run-only SECONDS TARGET BUILD_DIR [-- LIBFUZZER-ARGS...]
#       runs TARGET (frontend, plan or hf) of an existing clang build; what the fuzz_* tests do.
#
# A crash, a sanitizer report (AddressSanitizer, UndefinedBehaviorSanitizer), a leak, a hang
# of more than 10 s or more than 4 GiB on one input ends the run with a non-zero status and
# writes the input to BUILD_DIR/fuzz/TARGET/crash-*, so that `parc_fuzz_TARGET FILE` replays
# it. The corpora grow in BUILD_DIR/fuzz/TARGET/corpus; the seeds are examples/, the lit
# tests' .par files and the plans parc lowers from them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

seconds=60 targets=(frontend plan hf) build="$root/build-fuzz" build_it=1
if [[ "${1:-}" == "--run-only" ]]; then
  seconds="$2" targets=("$3") build="$(cd "$4" && pwd)" build_it=0
  shift 4
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  seconds="$1"
  shift
fi
[[ "${1:-}" == "--" ]] && shift
extra=("$@")

if ((build_it)); then
  if [[ ! -f "$build/build.ninja" ]]; then
    CXX=clang++-14 CC=clang-14 cmake -S "$root" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build "$build" --target parc parc_fuzz_frontend parc_fuzz_plan parc_fuzz_hf
fi

# Seeds: every .par file of the examples and the lit tests (the lowering tests among them),
# and two rank plans and the manifest of each job parc can lower from them.
seed_frontend() {
  local out="$1"
  mkdir -p "$out"
  local n=0
  while IFS= read -r file; do
    cp "$file" "$out/$(printf '%04d' $n)-$(basename "$file")"
    n=$((n + 1))
  done < <(find "$root/examples" "$root/test/lit" -name '*.par' | sort)
}
seed_plan() {
  local out="$1" work
  work="$(mktemp -d)"
  mkdir -p "$out"
  for par in "$root/examples/tiny.par" "$root"/test/lit/lower/*.par "$root"/test/lit/runtime/Inputs/*.par; do
    local name
    name="$(basename "$par" .par)"
    "$build/bin/parc" "$par" -o "$work/$name" >/dev/null 2>&1 || continue
    cp "$work/$name/manifest.json" "$out/$name-manifest.json"
    for rank in "$work/$name"/rank-0000[01].json; do
      [[ -f "$rank" ]] && cp "$rank" "$out/$name-$(basename "$rank")"
    done
  done
  rm -rf "$work"
}

# Seeds: the Hugging Face configs of the examples and the lit tests.
seed_hf() {
  local out="$1"
  mkdir -p "$out"
  find "$root/examples/hf" "$root/test/lit/interop" -name '*.json' -exec cp {} "$out/" \;
}

status=0
for target in "${targets[@]}"; do
  dir="$build/fuzz/$target"
  mkdir -p "$dir/corpus"
  rm -rf "$dir/seeds"
  "seed_$target" "$dir/seeds"
  args=(-timeout=10 -rss_limit_mb=4096 -print_final_stats=1 "-artifact_prefix=$dir/")
  ((seconds > 0)) && args+=("-max_total_time=$seconds")
  [[ "$target" == frontend ]] && args+=("-dict=$root/test/fuzz/par.dict")
  [[ "$target" == hf ]] && args+=("-dict=$root/test/fuzz/hf.dict")
  echo "fuzz.sh: parc_fuzz_$target ${args[*]} ${extra[*]:-}" >&2
  # The cwd is the target's folder: an input's `include "x"` reads from there, not the tree.
  if ! (cd "$dir" && "$build/bin/parc_fuzz_$target" "${args[@]}" "${extra[@]}" corpus seeds); then
    echo "fuzz.sh: parc_fuzz_$target failed; the input is in $dir/" >&2
    status=1
  fi
done
exit $status
