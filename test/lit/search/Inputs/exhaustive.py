"""Every mapping of Inputs/space.par one at a time through parc --report=json: prints the
fastest step among those that fit, the number of mappings that fit, and the search's best.
ZeRO with dp 1 is left out: it is zero 0 under another name, which the search drops."""
import itertools, json, os, subprocess, sys

parc, space, search_json, workdir = sys.argv[1:5]
source = open(space).read()
head = source[: source.index("parallel for")]
best, fits = None, 0
for tp, pp, mb, sched, zero, rc in itertools.product(
        (1, 2, 4, 8), (1, 2, 3, 4), (1, 2, 4), ("1f1b", "interleaved(chunks = 2)"), (0, 1),
        ("none", "full")):
    if zero and 16 % (tp * pp) == 0 and 16 // (tp * pp) == 1:
        continue  # ZeRO with dp 1 shards nothing: the search drops it as zero 0's twin
    par = (f"parallel for gpt on two {{\n  tp = {tp}; pp = {pp}; micro_batch = {mb}\n"
           f"  global_batch = 64; schedule = {sched}; zero = {zero}; recompute = {rc}\n}}\n")
    path = os.path.join(workdir, f"m-{tp}-{pp}-{mb}-{sched[:4]}-{zero}-{rc}.par")
    open(path, "w").write(head + par)
    run = subprocess.run([parc, path, "--report=json"], capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout:
        continue  # a rule refused it, as the search does
    report = json.loads(run.stdout)
    if not report["fits"]:
        continue
    fits += 1
    step = report["step_time_estimate_s"]
    best = step if best is None else min(best, step)
found = json.load(open(search_json))
top = found["top"][0]["step_time_estimate_s"]
print("one at a time: %d fit, fastest %.9g s" % (fits, best))
print("search: %d feasible, best %.9g s" % (found["feasible"], top))
print("search best is no slower:", top <= best * (1 + 1e-12))
