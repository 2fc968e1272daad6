#!/usr/bin/env bash
# Set up, build, and run every test (lit + GoogleTest) through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j2
