#!/usr/bin/env python3
"""drop-instruction.py PLAN.json OP: removes the first schedule instruction of kind OP from a
rank plan, leaving a plan that still reads but whose peer will wait forever."""
import json
import sys

path, op = sys.argv[1], sys.argv[2]
with open(path) as f:
    plan = json.load(f)
index = next(i for i, instr in enumerate(plan["schedule"]) if instr["op"] == op)
del plan["schedule"][index]
with open(path, "w") as f:
    json.dump(plan, f, indent=2)
