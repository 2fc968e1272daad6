#!/usr/bin/env python3
"""edit-plan.py FILE PATH VALUE [PATH VALUE ...]: sets each JSON PATH of FILE (a rank plan,
manifest or checkpoint manifest) to VALUE, given as JSON, as a user with an editor might.
PATH is written as the verifier names fields: `chunks[0].tensors["block.0.ln1"].shape`.
`swap:PATH:I:J` as VALUE swaps elements I and J of the list at PATH instead, and
`copy:FROM` sets PATH to a copy of the value at path FROM."""
import json
import re
import sys

TOKEN = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\["([^"]*)"\]')


def steps(path):
    out, pos = [], 0
    while pos < len(path):
        match = TOKEN.match(path, pos)
        if not match:
            sys.exit(f"edit-plan.py: cannot read the path {path!r} at {pos}")
        key, index, quoted = match.groups()
        out.append(int(index) if index is not None else key if key is not None else quoted)
        pos = match.end()
    return out


def main():
    file, edits = sys.argv[1], sys.argv[2:]
    with open(file) as f:
        document = json.load(f)
    for path, value in zip(edits[::2], edits[1::2]):
        *parents, last = steps(path)
        node = document
        for step in parents:
            node = node[step]
        if value.startswith("copy:"):
            source = document
            for step in steps(value[5:]):
                source = source[step]
            node[last] = json.loads(json.dumps(source))
        elif value.startswith("swap:"):
            i, j = (int(x) for x in value[5:].split(":"))
            node[last][i], node[last][j] = node[last][j], node[last][i]
        else:
            node[last] = json.loads(value)
    with open(file, "w") as f:
        json.dump(document, f, indent=2)


main()
