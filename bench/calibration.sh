#!/usr/bin/env bash
# The step-time model against published measured training runs: writes every row of a runs
# file as a .par program, runs `parc --report=json` on it and prints measured vs predicted
# step time per run, the MAPE overall and per group, and the rank correlation within each
# sweep of mappings of one model. Not a test: it prints a table.
#
# Usage: bench/calibration.sh [RUNS.json] [--parc PATH] [--keep DIR] [--json OUT]
#   RUNS.json   default bench/calibration/published-runs.json (Megatron-LM 2021 Tables 1-2,
#               Korthikanti et al. 2022 Table 5; a copy of shared/calibration)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec python3 "$root/bench/calibration/runs.py" "$@"
