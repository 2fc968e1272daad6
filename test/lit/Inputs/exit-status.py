#!/usr/bin/env python3
"""exit-status.py CMD [ARG...]: runs CMD with its standard error joined to its output, then
prints `exit N` with CMD's exit status (`signal S` if a signal ended it), so that a lit test
can check the exact code and not only that it failed (`not` accepts any non-zero status)."""
import subprocess
import sys

result = subprocess.run(sys.argv[1:], stderr=subprocess.STDOUT)
sys.stdout.flush()
if result.returncode < 0:
    print(f"signal {-result.returncode}")
else:
    print(f"exit {result.returncode}")
