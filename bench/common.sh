# Shared by the bench scripts (sourced): where a run keeps its files, and tiny.par at 1 rank.

# Sets `work` to DIR (created; kept) or to a temporary directory removed at exit.
bench_work_dir() {
  if [[ -n $1 ]]; then
    mkdir -p "$1"
    work=$(cd "$1" && pwd)
  else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
  fi
}

# Writes examples/tiny.par at 1 rank to OUT: only the cluster size and the mapping change.
# SCRIPT names the caller in the error when tiny.par no longer has the shape this rewrites.
tiny_one_rank() {
  local root out=$1 script=$2
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  sed -e 's/gpus_per_node = 8 /gpus_per_node = 1 /' -e 's/^\(  [tpd][pd]\) = 2$/\1 = 1/' \
    "$root/examples/tiny.par" > "$out"
  if ! grep -q '^  tp = 1$' "$out" || ! grep -q 'gpus_per_node = 1 ' "$out"; then
    echo "$script: examples/tiny.par changed shape; update the 1-rank rewrite" >&2
    exit 1
  fi
}
