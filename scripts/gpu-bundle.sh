#!/usr/bin/env bash
# gpu-bundle.sh - build here everything scripts/gpu-check.sh runs on a GPU machine.
#
#   scripts/gpu-bundle.sh            # then carry .gpu-bundle to the GPU machine
#
# The GPU machine has the CUDA toolkit, NCCL (through PyTorch's wheels) and python3, but no
# LLVM, ANTLR, MPI or OpenBLAS packages and no network: it cannot build parc or parrun. So this
# script builds them here (Release, SASS for sm_80 and sm_90) and writes .gpu-bundle/:
#   bin/      the stripped binaries: parc, parrun, the CUDA GoogleTest suites, parc_kernel_bench
#   lib/      every shared library they load that the GPU machine may lack (all but glibc,
#             libstdc++, libgcc and the CUDA libraries, which come from that machine); a
#             library over 4 MiB is stored xz-compressed (NAME.xz) for the size limit, and
#             gpu-check.sh unpacks it
#   sysroot/  this machine's dynamic loader, glibc, libstdc++ and libgcc: the binaries need
#             glibc 2.36 (LLVM's arc4random), which an older image lacks; gpu-check.sh then
#             starts them through this loader instead of the machine's
#   plans/    examples/gpt-1.3b.par's plans and its `parc --report=json`, and the GPU
#             equivalence sweep's plans (test/runtime/sweep.py --prepare)
#   MANIFEST  git commit, date, toolchain, every file and its size
# The working tree and the carried paths travel in 64 MiB together, so the bundle must stay
# under 56 MiB. Running it again rebuilds what changed and replaces the bundle.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-gpu
bundle=$root/.gpu-bundle
limit_mib=56
compress_over=$((4 << 20))
jobs=${JOBS:-3}

fail() { echo "gpu-bundle: error: $*" >&2; exit 1; }

# shellcheck source=gpu-libraries.sh
source "$root/scripts/gpu-libraries.sh"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CUDA_ARCHITECTURES=80;90" >/dev/null
targets=(parc parrun parc_cuda_kernel_tests parc_cuda_device_tests parc_cuda_flash_tests
  parc_cuda_comm_tests parc_kernel_bench)
available=$(ninja -C "$build" -t targets all | sed 's/:.*//')
for target in "${targets[@]}"; do
  grep -qx "$target" <<<"$available" ||
    fail "target $target does not exist in $build: is nvcc (/usr/local/cuda) with NCCL installed?"
done
ninja -C "$build" -j"$jobs" "${targets[@]}"

# Staged inside the build directory (ignored, same file system) and moved into place whole.
stage=$build/gpu-bundle.stage
rm -rf "$stage"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/plans"

for target in "${targets[@]}"; do
  strip --strip-unneeded -o "$stage/bin/$target" "$build/bin/$target"
done

# Every library ldd resolves for any binary, by its soname, as the dynamic loader looks it up.
declare -A libs=()
for binary in "$stage"/bin/*; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $name =~ $system_lib || $name =~ $cuda_lib ]] && continue
    [[ $path == not ]] && fail "$(basename "$binary") needs $name, which is not found here"
    libs[$name]=$path
  done < <(ldd "$binary")
done
# The C runtime the binaries were linked against, whole: glibc's parts only work together.
declare -A runtime_libs=()
for binary in "$stage"/bin/*; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" && $name =~ $system_lib ]] && runtime_libs[$name]=$path
  done < <(ldd "$binary")
done
loader=$(readelf -l "$stage/bin/parrun" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[[ -n $loader && -e $loader ]] || fail "cannot find the dynamic loader of parrun"
mkdir -p "$stage/sysroot"
cp -L "$loader" "$stage/sysroot/$(basename "$loader")"
for name in "${!runtime_libs[@]}"; do
  cp -L "${runtime_libs[$name]}" "$stage/sysroot/$name"
done

for name in "${!libs[@]}"; do
  if (($(stat -L -c %s "${libs[$name]}") > compress_over)); then
    xz -T0 -6 -c "${libs[$name]}" >"$stage/lib/$name.xz"
  else
    cp -L "${libs[$name]}" "$stage/lib/$name"
  fi
done

parc=$stage/bin/parc
"$parc" "$root/examples/gpt-1.3b.par" -o "$stage/plans/gpt-1.3b" >/dev/null
"$parc" "$root/examples/gpt-1.3b.par" --report=json >"$stage/plans/gpt-1.3b.report.json"
python3 "$root/test/runtime/sweep.py" "$stage/bin" --prepare "$stage/plans/sweep" --jobs "$jobs"

sha=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
[[ -z $(git -C "$root" status --porcelain 2>/dev/null) ]] || sha="$sha (with uncommitted changes)"
{
  echo "parc GPU bundle (scripts/gpu-bundle.sh; run with scripts/gpu-check.sh)"
  echo "commit:  $sha"
  echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "built:   $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}'), $(/usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*'), CMAKE_CUDA_ARCHITECTURES 80;90, Release"
  echo "files:   size path"
  (cd "$stage" && find . -type f ! -name MANIFEST -printf '%s %P\n' | sort -k2)
} >"$stage/MANIFEST"

size=$(du -sb "$stage" | cut -f1)
size_mib=$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }')
if ((size > limit_mib << 20)); then
  du -sh "$stage"/* >&2
  fail "the bundle is $size_mib MiB, over the $limit_mib MiB limit (the working tree and the carried paths travel in 64 MiB together); the previous bundle is left as it was"
fi
rm -rf "$bundle"
mv "$stage" "$bundle"
trap - EXIT

part() { awk -v b="$(du -sb "$bundle/$1" | cut -f1)" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu-bundle: $bundle is $size_mib MiB (limit $limit_mib MiB): bin $(part bin) ($(ls "$bundle/bin" | wc -l) binaries), lib $(part lib) ($(ls "$bundle/lib" | wc -l) libraries), sysroot $(part sysroot), plans $(part plans) (gpt-1.3b and $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["cases"]))' "$bundle/plans/sweep/index.json") sweep mappings)"
echo "gpu-bundle: carry .gpu-bundle and run scripts/gpu-check.sh there (scripts/gpu-check.sh --dry-run checks it here)"
