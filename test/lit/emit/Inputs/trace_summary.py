"""Summarises a parc --emit=trace file for lit: slices per pipeline stage (over its four
tracks: compute, tp, pp, dp), and whether any two slices of a track overlap without one
containing the other."""
import collections
import json
import sys

trace = json.load(open(sys.argv[1]))
info = trace["otherData"]
print(f"model {info['model']}, {info['pp']} stages, {info['microbatches']} microbatches, "
      f"{info['schedule']}, {info['chunks']} chunks")
tracks = collections.defaultdict(list)
for event in trace["traceEvents"]:
    if event["ph"] == "X":
        # Integer nanoseconds: ts and dur have three decimals of microseconds.
        start = round(event["ts"] * 1000)
        tracks[event["tid"]].append((start, start + round(event["dur"] * 1000), event["name"]))
TRACKS_PER_STAGE = 4
stages = collections.defaultdict(lambda: [collections.Counter(), 0])
for tid in sorted(tracks):
    slices = sorted(tracks[tid], key=lambda s: (s[0], -s[1]))
    open_ends, partial = [], 0
    for start, end, _ in slices:
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        if open_ends and end > open_ends[-1]:
            partial += 1
        open_ends.append(end)
    summary = stages[tid // TRACKS_PER_STAGE]
    summary[0].update(name.split()[0] for _, _, name in slices)
    summary[1] += partial
for stage in sorted(stages):
    kinds, partial = stages[stage]
    print(f"stage {stage}: {kinds['F']} F, {kinds['B']} B, sends and receives "
          f"{kinds['send'] + kinds['recv']}, tp {kinds['tp']}, optimizer {kinds['optimizer']}, "
          f"partial overlaps {partial}")
