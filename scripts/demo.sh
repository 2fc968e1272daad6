#!/usr/bin/env bash
# The main job: set up, build, check and summarise the GPT-3 175B plan, then plan the tiny GPT
# and train it on its 8 ranks (threads of one parrun) over the shipped text, the loss falling.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build/bin/parc examples/gpt3-175b.par
echo
plans=$(mktemp -d)
trap 'rm -rf "$plans"' EXIT
build/bin/parc examples/tiny.par -o "$plans/tiny"
echo
# 400 steps take about 1.5 minutes on 2 cores: enough to see the loss fall from ln 256 = 5.5.
build/bin/parrun "$plans/tiny" --steps 400 --log-every 40 --data examples/data/tz-news.txt
