#!/usr/bin/env bash
# Installs every Debian package parc needs. Idempotent: packages already present are skipped,
# so a second run costs one dpkg query.
set -euo pipefail
packages=(
  antlr4 libantlr4-runtime-dev          # parser generator 4.7.2 + C++ runtime 4.9
  llvm-14-dev llvm-14-tools              # LLVM Support (cl, SourceMgr, json), lit, FileCheck, not
  libgtest-dev cmake ninja-build g++ python3
  libopenmpi-dev openmpi-bin libopenblas-dev
)
names=()
for p in "${packages[@]}"; do names+=("$p"); done
missing=()
for p in "${names[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
