"""What parc says of a job, for the checks to compare with: the mapping from --report=json,
the model's and the training's settings from --emit=ast; and how a check says its verdict."""
import json
import re
import subprocess
import sys


def job_facts(parc, par):
    report = json.loads(subprocess.run([parc, par, "--report=json"], capture_output=True,
                                       text=True, check=True).stdout)
    ast = subprocess.run([parc, par, "--emit=ast"], capture_output=True, text=True,
                         check=True).stdout
    fields = dict(re.findall(r"^  (\w+) = (\S+)", ast, re.M))
    return {"dp": report["dp"], "tp": report["tp"], "pp": report["pp"], "zero": report["zero"],
            "dtype": fields["dtype"], "lr": float(fields["lr"]),
            "warmup": int(fields["warmup_steps"])}


def verdict(tool, name, problems, summary):
    """One line: `ok` and what the tool accepted, or `MISMATCH` and why (exit 1)."""
    if problems:
        print(f"MISMATCH {tool:9} {name}: " + "; ".join(problems))
        sys.exit(1)
    print(f"ok       {tool:9} {name}: {summary}")
