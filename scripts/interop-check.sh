#!/usr/bin/env bash
# Optional interoperation check, not run by CI (its venv is gigabytes): the tools' own code
# judges what parc imports and exports.
#   1. Each examples/hf/*.json imports with the parameter count
#      transformers gives the model it builds on the meta device.
#   2. DeepSpeed's DeepSpeedConfig accepts each --emit=deepspeed export for the job's
#      data-parallel size with the job's batch, ZeRO stage and precision, and its WarmupLR
#      replays parc's learning rates.
#   3. With MEGATRON_LM set to a Megatron-LM checkout, Megatron's parse_args, validate_args and
#      TransformerConfig accept each --emit=megatron export (Megatron's code is read from the
#      checkout, not installed).
# The jobs: the examples, test/lit/interop/Inputs/features-*.par, and each imported model in
# test/lit/interop/Inputs/job.par. A refused export is listed with its first error.
#
#   scripts/interop-check.sh [BUILD_DIR]
#   env: INTEROP_VENV (default ~/.cache/parc-interop-venv), MEGATRON_LM (optional)
set -euo pipefail
shopt -s nullglob
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
parc=$build/bin/parc
venv=${INTEROP_VENV:-$HOME/.cache/parc-interop-venv}
[[ -x $parc ]] || { echo "no parc at $parc: build first (scripts/build.sh)" >&2; exit 2; }
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import transformers, deepspeed' 2>/dev/null; then
  echo "== creating $venv (transformers, deepspeed from PyPI)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet transformers deepspeed
fi
py=$venv/bin/python
"$py" -c 'import transformers, deepspeed, torch; print("transformers", transformers.__version__, "| deepspeed", deepspeed.__version__, "| torch", torch.__version__)' 2>/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH=$root/scripts/interop${MEGATRON_LM:+:$MEGATRON_LM}
failures=0
# A check's verdict line; its libraries' log lines only when it fails.
run() {
  if "$@" >"$work/out" 2>"$work/stderr"; then
    grep -E '^ok ' "$work/out"
  else
    failures=$((failures + 1))
    grep -E '^MISMATCH ' "$work/out" || tail -5 "$work/stderr"
  fi
}
refused() { echo "refused  $1: $(grep -m1 'error:' "$work/stderr" | sed 's/^.*error: //')"; }

echo "== Hugging Face configs: parc's parameter count against transformers'"
jobs=()
for config in "$root"/examples/hf/*.json; do
  name=$(basename "$config" .json)
  if ! "$parc" --import-hf="$config" -o "$work/$name.par" 2>"$work/stderr"; then
    refused "$name"
    continue
  fi
  run "$py" "$root/scripts/interop/hf_count.py" "$config" \
    "$(sed -n 's/^# \([0-9,]*\) parameters.*/\1/p' "$work/$name.par" | tr -d ,)"
  # The job of test/lit/interop: 32 H100s, seq 2048 (GPT-2's table has 1024 rows).
  seq=2048; [[ $name == gpt2 ]] && seq=1024
  sed -e "s/^\(  seq *=\) [0-9]*/\1 $seq/" "$work/$name.par" > "$work/$name.model.par"
  model=$(sed -n 's/^model \([A-Za-z0-9_]*\) {/\1/p' "$work/$name.par")
  sed -e "s|MODEL|$model|" -e "s|IMPORTED|$work/$name.model.par|" \
    "$root/test/lit/interop/Inputs/job.par" > "$work/$name-job.par"
  jobs+=("$work/$name-job.par")
done

echo "== Exports: DeepSpeed's DeepSpeedConfig and, with MEGATRON_LM, Megatron-LM's validate_args"
[[ -n ${MEGATRON_LM:-} ]] || echo "(MEGATRON_LM is not set: the Megatron-LM exports are written, not validated)"
for job in "$root"/examples/{gpt3-175b,llama2-70b,tiny,gpt-1.3b}.par \
  "$root"/test/lit/interop/Inputs/features-*.par "${jobs[@]}"; do
  name=$(basename "$job" .par)
  if "$parc" "$job" --emit=megatron -o "$work/$name.sh" 2>"$work/stderr"; then
    if [[ -n ${MEGATRON_LM:-} ]]; then
      run "$py" "$root/scripts/interop/megatron_check.py" "$parc" "$job" "$work/$name.sh"
    fi
  else
    refused "megatron  $name"
  fi
  if "$parc" "$job" --emit=deepspeed -o "$work/$name.json" 2>"$work/stderr"; then
    run "$py" "$root/scripts/interop/deepspeed_check.py" "$parc" "$job" "$work/$name.json"
  else
    refused "deepspeed $name"
  fi
done

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
