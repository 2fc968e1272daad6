#!/usr/bin/env bash
# The main job: set up, build, then check and summarise the GPT-3 175B plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build/bin/parc examples/gpt3-175b.par
