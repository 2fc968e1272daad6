#!/bin/sh
# parrun under mpirun (one process per rank) must train exactly as the local run: the
# tp 2, pp 2, dp 2 plan in fp64 against the single-rank reference, and a wrong -np must fail
# every rank with the world-size message. Run by ctest (parrun_mpi), which passes the tools and
# the launcher: mpi-equivalence.sh BIN_DIR -- MPIRUN [ARGS...] (without -np).
set -eu
bin=$1
shift 2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin/parc" "$here/Inputs/single.par" -o "$work/single" > /dev/null 2>&1
"$bin/parc" "$here/Inputs/tp2-pp2-dp2.par" -o "$work/3d" > /dev/null 2>&1
"$bin/parrun" "$work/single" --comm=local --precision=fp64 --dump-weights "$work/single.json" \
  > /dev/null
"$@" -np 8 "$bin/parrun" "$work/3d" --comm=mpi --precision=fp64 --timeout 60 \
  --dump-weights "$work/mpi.json" > "$work/mpi.log"
grep -q '^step 3 loss' "$work/mpi.log"
python3 "$here/compare.py" "$work/single.json" "$work/mpi.json"

if "$@" -np 4 "$bin/parrun" "$work/3d" --comm=mpi > "$work/wrong.log" 2>&1; then
  echo "parrun accepted 4 processes for an 8-rank plan" >&2
  exit 1
fi
grep -q "are for 8 ranks but this job has 4" "$work/wrong.log"
echo "mpi runs match the local reference"
