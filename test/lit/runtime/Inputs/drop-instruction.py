#!/usr/bin/env python3
"""drop-instruction.py PLAN.json OP [AFTER]: removes the first schedule instruction of kind OP
from a rank plan, leaving a plan that still reads but whose peer would wait forever; with
AFTER, moves it after the first instruction of kind AFTER instead, so that every message is
still sent but too late (the rank waits for a reply to what it has not sent yet)."""
import json
import sys

path, op = sys.argv[1], sys.argv[2]
after = sys.argv[3] if len(sys.argv) > 3 else None
with open(path) as f:
    plan = json.load(f)
schedule = plan["schedule"]
index = next(i for i, instr in enumerate(schedule) if instr["op"] == op)
moved = schedule.pop(index)
if after is not None:
    target = next(i for i, instr in enumerate(schedule) if instr["op"] == after)
    schedule.insert(target + 1, moved)
with open(path, "w") as f:
    json.dump(plan, f, indent=2)
