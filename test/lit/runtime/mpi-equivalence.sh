#!/bin/sh
# parrun under mpirun (one process per rank) must train exactly as the local run: the
# tp 2, pp 2, dp 2 plan in fp64 against the single-rank reference, and a wrong -np must fail
# every rank with the world-size message, and a rank killed mid-run must end the job. Run by
# ctest (parrun_mpi), which passes the tools and the launcher:
#   mpi-equivalence.sh BIN_DIR -- MPIRUN [ARGS...] (without -np).
set -eu
bin=$1
shift 2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
launcher=
# A check that fails while the million-step job runs must not leave its ranks training.
cleanup() {
  if [ -n "$launcher" ]; then
    pkill -9 -P "$launcher" 2>/dev/null || true
    kill -9 "$launcher" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# dash runs no EXIT trap when a signal ends it (ctest's timeout, ^C): exit, and so clean up.
trap 'exit 1' INT TERM HUP

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

# A rank killed mid-run ends the whole job with an error within seconds, never a hang (the
# --timeout of the others is the backstop; the launcher normally notices first).
"$@" -np 8 "$bin/parrun" "$work/3d" --comm=mpi --steps 1000000 --timeout 30 \
  > "$work/killed.log" 2>&1 &
launcher=$!
sleep 3
victim=$(pgrep -P "$launcher" -x parrun | tail -n 1)
[ -n "$victim" ] || { echo "no parrun process to kill" >&2; exit 1; }
started=$(date +%s)
kill -9 "$victim"
if wait "$launcher"; then
  launcher=
  echo "the job exited 0 after one of its ranks was killed" >&2
  exit 1
fi
launcher=
elapsed=$(( $(date +%s) - started ))
[ "$elapsed" -le 40 ] || { echo "the job took ${elapsed} s to end after a rank died" >&2; exit 1; }
echo "mpi runs match the local reference"
