#!/usr/bin/env python3
"""Equivalence sweep: every mapping of a small GPT must train exactly as one rank does.

    sweep.py BIN_DIR [--mpirun LAUNCHER...] [--jobs N] [--only SUBSTRING] [--keep DIR]
             [--loss-rtol-fp64 R] [--weight-rtol-fp64 T]
    sweep.py BIN_DIR --prepare DIR [--jobs N] [--only SUBSTRING]
    sweep.py --run-prepared DIR --parrun PARRUN [--parrun-args "ARGS"] [--jobs N]
             [--only SUBSTRING] [--keep DIR] [--loss-rtol R] [--case-timeout S]

One `.par` template, instantiated per case: the model (4 transformer blocks, 8 where
interleaved over pp 4 needs 2 chunks of a block per stage; hidden 64, 4 heads, optionally 2 kv
heads; vocab 512 so that the padded vocabulary is 512 at tp 1, 2 and 4; seq 32) and its training
settings never change, only the `parallel for` block and the cluster size do. Each case is
planned with `parc`, trained 3 steps with `parrun --dump-weights`, and compared with the
single-rank run of the same model and precision: every step's loss to a relative R, every
gathered parameter to T of its scale (max|a - b| / max(max|a|, 1e-3), see compare.py), and every
replicated copy bit-identical.

Cases (world = tp * pp * dp * cp <= 8, tp in {1,2,4}, pp in {1,2,4}, dp in {1,2}, cp in {1,2,4}):
  - every mapping under every schedule (interleaved only where pp > 1), fp64, --comm=local;
  - zero 0-3 x recompute none/selective/full x sequence parallel off/on on tp 2 pp 2 dp 2,
    cycling the three schedules;
  - kv_heads 2 under every mapping;
  - imported models' fields (VARIANTS: q/k/v-only biases, head_dim, rope_theta, norm_eps,
    max_positions) on a few mappings;
  - ZeRO, recompute and sequence parallelism on the other mappings with tp > 1 and dp > 1;
  - context parallelism (cp 2 and 4) alone and with tp, pp, dp, ZeRO, recompute, sequence
    parallelism, grouped-query attention and rotary positions;
  - mixture-of-experts blocks (expert tensor parallelism = tp) beside tp, pp and dp, with
    ZeRO, recompute, sequence parallelism and shared experts, on one expert-parallel rank and
    with ep 2 and 4 carved from dp (the token all-to-all, ZeRO over expert dp);
  - a subset in fp32 (tolerance 1e-5);
  - with --mpirun, a subset as one process per rank under the launcher (--comm=mpi).

Prints one row per case and `N passed, M failed`; exits 1 when any case fails.

The GPU sweep (scripts/gpu-check.sh) runs where there is no parc, so it is split in two.
`--prepare DIR` plans the fp32 GPU subset (GPU_CASES: tp, pp under every schedule, dp, ZeRO
1-3, recompute, sequence parallelism, grouped-query attention, Llama's block, MoE) and its single-rank references
into DIR with BIN_DIR's parc, with an index.json naming each case's reference.
`--run-prepared DIR` trains every plan of DIR with PARRUN (its --parrun-args added, e.g.
"--backend=cuda"; ranks as threads, --comm=local) and compares each case's per-step losses
with its reference's from the same PARRUN and arguments, to a relative R (default 1e-5). The
weights' difference and the largest difference between replicas are printed, not judged.
"""
import argparse
import concurrent.futures
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from sweep_cases import (GPU_CASES, GRAD_BUCKET_ARGS, TOLERANCE, VARIANTS,  # noqa: F401
                         Case, build_cases, references_for)


def run(command, log):
    with open(log, "w") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode


def plan(case, directory, bin_dir):
    """Writes CASE's .par into DIRECTORY and plans it; returns (plans dir, error or None)."""
    os.makedirs(directory, exist_ok=True)
    par = os.path.join(directory, "job.par")
    with open(par, "w") as f:
        f.write(case.par_text())
    plans = os.path.join(directory, "plans")
    if run([os.path.join(bin_dir, "parc"), par, "-o", plans], os.path.join(directory, "parc.log")):
        return plans, "parc failed (see parc.log)"
    return plans, None


def train_plans(parrun, directory, timeout=None):
    """Runs the PARRUN command line, which writes DIRECTORY/weights.json; returns (weights
    file, error or None)."""
    weights, log = os.path.join(directory, "weights.json"), os.path.join(directory, "run.log")
    try:
        with open(log, "w") as out:
            status = subprocess.run(parrun + ["--dump-weights", weights], stdout=out,
                                    stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return weights, f"parrun did not finish in {timeout} s"
    if status:
        with open(log) as f:
            tail = f.read().strip().splitlines()[-1:] or ["no output"]
        return weights, f"parrun failed: {tail[0]}"
    return weights, None


def train(case, directory, bin_dir, mpirun):
    """Plans and trains CASE in DIRECTORY; returns (weights file, error or None)."""
    plans, error = plan(case, directory, bin_dir)
    if error:
        return os.path.join(directory, "weights.json"), error
    parrun = [os.path.join(bin_dir, "parrun"), plans, f"--precision={case.precision}",
              f"--comm={case.comm}", "--timeout", "60",
              "--memory-json", os.path.join(directory, "memory.json")] + GRAD_BUCKET_ARGS
    if case.comm == "mpi":
        parrun = mpirun + ["-np", str(case.world)] + parrun
    return train_plans(parrun, directory)


def compare(ref_path, other_path, loss_rtol, weight_rtol, check_replicas=True):
    """Returns (max loss rel diff, max weight rel diff, list of problems)."""
    with open(ref_path) as f:
        ref = json.load(f)
    with open(other_path) as f:
        other = json.load(f)
    problems = []
    for label, dump in (("reference", ref), ("run", other)):
        if check_replicas and dump["max_replica_difference"] != 0:
            problems.append(f"replicas differ in {label} by {dump['max_replica_difference']:.2e}")
        if dump.get("max_padding_value", 0) != 0:
            problems.append(f"the vocabulary's padding in {label} is not zero "
                            f"({dump['max_padding_value']:.2e})")
    if len(ref["losses"]) != len(other["losses"]):
        return math.inf, math.inf, problems + ["step counts differ"]
    loss_diff = 0.0
    for a, b in zip(ref["losses"], other["losses"]):
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.inf, math.inf, problems + ["non-finite loss"]
        loss_diff = max(loss_diff, abs(a - b) / max(abs(a), 1e-300))
    if set(ref["params"]) != set(other["params"]):
        return loss_diff, math.inf, problems + ["parameter names differ"]
    weight_diff, worst = 0.0, ""
    for name, a in ref["params"].items():
        b = other["params"][name]
        if a["shape"] != b["shape"]:
            return loss_diff, math.inf, problems + [f"{name}: shape differs"]
        scale = max(max(abs(x) for x in a["data"]), 1e-3)
        diff = max(abs(x - y) for x, y in zip(a["data"], b["data"])) / scale
        if diff > weight_diff:
            weight_diff, worst = diff, name
    if not loss_diff <= loss_rtol:
        problems.append(f"loss differs by {loss_diff:.2e} > {loss_rtol:g}")
    if not weight_diff <= weight_rtol:
        problems.append(f"{worst} differs by {weight_diff:.2e} of its scale > {weight_rtol:g}")
    return loss_diff, weight_diff, problems


# What ZeRO shards must be what parrun holds: ZeRO-2's gradients, ZeRO-3's weights too, per rank
# within this fraction of parc's prediction (test/runtime/memory_sweep.py checks every category).
ZERO_MEMORY_TOLERANCE = 0.05


def zero_memory_problems(case, directory):
    """The held gradient (zero >= 2) and weight (zero 3) bytes against the plan's prediction."""
    categories = (["grads"] if case.zero >= 2 else []) + (["weights"] if case.zero >= 3 else [])
    if not categories or case.precision != "fp32" and case.precision != "fp64":
        return []
    with open(os.path.join(directory, "memory.json")) as f:
        report = json.load(f)
    # fp64 holds twice the model's fp32 bytes for weights and gradients.
    factor = 2 if case.precision == "fp64" else 1
    problems = []
    for rank in report["ranks"]:
        for category in categories:
            held, predicted = rank["held"][category], factor * rank["predicted"][category]
            if abs(held - predicted) > ZERO_MEMORY_TOLERANCE * predicted:
                problems.append(f"rank {rank['rank']} holds {held} B of {category}, parc "
                                f"predicts {predicted} B")
    return problems[:2]


def finish(passed, failed, work, keep):
    """Prints the totals, removes WORK unless it is kept, and returns the exit status."""
    print(f"{passed} passed, {failed} failed")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def run_sweep(args):
    """The CPU sweep: plans and trains every case, compares with the single-rank runs."""
    tolerance = dict(TOLERANCE, fp64=(args.loss_rtol_fp64, args.weight_rtol_fp64))

    cases = [c for c in build_cases(bool(args.mpirun)) if args.only in c.name()]
    work = args.keep or tempfile.mkdtemp(prefix="parc-sweep-")
    started = time.monotonic()
    references = references_for(cases)

    def job(index_and_case):
        index, case = index_and_case
        return train(case, os.path.join(work, f"case-{index:03d}"), args.bin_dir, args.mpirun)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        ref_files = dict(zip(references, pool.map(
            job, ((1000 + i, r) for i, r in enumerate(references.values())))))
        broken = {k: err for k, (_, err) in ref_files.items() if err}
        results = list(pool.map(job, enumerate(cases)))

    passed = failed = 0
    print(f"{'mapping':<56} {'loss rel diff':>14} {'weight rel diff':>16}  result")
    for case, (weights, error) in zip(cases, results):
        loss_rtol, weight_rtol = tolerance[case.precision]
        key = case.model_key()
        if key in broken:
            error = f"reference run failed: {broken[key]}"
        if error:
            loss_diff, weight_diff, problems = math.inf, math.inf, [error]
        else:
            loss_diff, weight_diff, problems = compare(ref_files[key][0], weights, loss_rtol,
                                                       weight_rtol)
            problems += zero_memory_problems(case, os.path.dirname(weights))
        ok = not problems
        passed += ok
        failed += not ok
        print(f"{case.name():<56} {loss_diff:>14.2e} {weight_diff:>16.2e}  "
              f"{'ok' if ok else 'FAIL: ' + '; '.join(problems)}")
    limits = ", ".join(f"{precision} loss {loss:g} weights {weights:g}"
                       for precision, (loss, weights) in tolerance.items())
    print(f"tolerances: {limits} "
          f"(relative to each tensor's scale); {len(references)} single-rank references; "
          f"{time.monotonic() - started:.0f} s")
    return finish(passed, failed, work, args.keep)


PREPARED_FORMAT = "parc-sweep-prepared/1"


def prepare(args):
    """Plans GPU_CASES and their references into args.prepare, with index.json."""
    out = args.prepare
    if os.path.isdir(out) and os.listdir(out):
        if not os.path.exists(os.path.join(out, "index.json")):
            print(f"sweep.py: {out} exists and is not a prepared sweep; refusing to replace it",
                  file=sys.stderr)
            return 2
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    cases = [c for c in GPU_CASES if args.only in c.name()]
    references = references_for(cases)
    ref_dirs = {key: f"ref-{i}" for i, key in enumerate(references)}
    jobs = [(ref_dirs[key], ref) for key, ref in references.items()]
    jobs += [(f"case-{i:03d}", case) for i, case in enumerate(cases)]

    def job(dir_and_case):
        directory, case = dir_and_case
        return plan(case, os.path.join(out, directory), args.bin_dir)[1]

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        errors = [(d, err) for (d, _), err in zip(jobs, pool.map(job, jobs)) if err]
    for directory, error in errors:
        print(f"sweep.py: {directory}: {error}", file=sys.stderr)
    if errors:
        return 1
    index = {
        "format": PREPARED_FORMAT,
        "loss_rtol": TOLERANCE["fp32"][0],
        "references": [{"dir": ref_dirs[key], "name": ref.name(), "world": ref.world,
                        "precision": ref.precision} for key, ref in references.items()],
        "cases": [{"dir": f"case-{i:03d}", "name": case.name(), "world": case.world,
                   "precision": case.precision, "reference": ref_dirs[case.model_key()]}
                  for i, case in enumerate(cases)],
    }
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"prepared {len(cases)} mappings and {len(references)} single-rank references in {out}")
    return 0


def run_prepared(args):
    """Trains every prepared plan with args.parrun and compares losses with the references."""
    with open(os.path.join(args.run_prepared, "index.json")) as f:
        index = json.load(f)
    if index.get("format") != PREPARED_FORMAT:
        print(f"sweep.py: {args.run_prepared}/index.json is not {PREPARED_FORMAT}",
              file=sys.stderr)
        return 2
    extra = shlex.split(args.parrun_args)
    cases = [c for c in index["cases"] if args.only in c["name"]]
    references = [r for r in index["references"] if any(c["reference"] == r["dir"] for c in cases)]
    work = args.keep or tempfile.mkdtemp(prefix="parc-sweep-gpu-")
    started = time.monotonic()

    def job(entry):
        plans = os.path.join(args.run_prepared, entry["dir"], "plans")
        directory = os.path.join(work, entry["dir"])
        os.makedirs(directory, exist_ok=True)
        parrun = [args.parrun, plans] + extra + ["--timeout", "60"] + GRAD_BUCKET_ARGS
        if not any(a.startswith("--precision") for a in extra):
            parrun.append(f"--precision={entry['precision']}")
        if not any(a.startswith("--comm") for a in extra):
            parrun.append("--comm=local")
        begin = time.monotonic()
        weights, error = train_plans(parrun, directory, args.case_timeout)
        return weights, error, time.monotonic() - begin

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        ref_runs = dict(zip((r["dir"] for r in references), pool.map(job, references)))
        results = list(pool.map(job, cases))

    passed = failed = 0
    largest = 0.0
    print(f"{'mapping':<50} {'loss rel diff':>13} {'weight diff':>11} {'replicas':>8} "
          f"{'time':>6}  result (parrun {' '.join(extra)})")
    for case, (weights, error, seconds) in zip(cases, results):
        ref_weights, ref_error, _ = ref_runs[case["reference"]]
        if ref_error:
            error = f"reference {case['reference']} failed: {ref_error}"
        replicas = math.inf
        if error:
            loss_diff, weight_diff, problems = math.inf, math.inf, [error]
        else:
            loss_diff, weight_diff, problems = compare(ref_weights, weights, args.loss_rtol,
                                                       math.inf, check_replicas=False)
            with open(weights) as f:
                replicas = json.load(f)["max_replica_difference"]
        ok = not problems
        passed += ok
        failed += not ok
        largest = max(largest, loss_diff)
        print(f"{case['name']:<50} {loss_diff:>13.2e} {weight_diff:>11.2e} {replicas:>8.1e} "
              f"{seconds:>5.1f}s  {'ok' if ok else 'FAIL: ' + '; '.join(problems)}", flush=True)
    print(f"largest loss difference {largest:.2e}, tolerance {args.loss_rtol:g} relative to the "
          f"single-rank run with the same parrun arguments (weights and replica differences "
          f"shown, not judged); {len(references)} references; "
          f"{time.monotonic() - started:.0f} s")
    # A run that selected nothing checked nothing: it fails.
    return finish(passed, failed, work, args.keep) or (0 if cases else 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bin_dir", nargs="?", help="where parc and parrun are")
    parser.add_argument("--mpirun", nargs=argparse.REMAINDER, default=[],
                        help="launcher and its options (without -np); the rest of the line")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--keep", help="write the cases' files here and keep them")
    parser.add_argument("--loss-rtol-fp64", type=float, default=TOLERANCE["fp64"][0])
    parser.add_argument("--weight-rtol-fp64", type=float, default=TOLERANCE["fp64"][1])
    parser.add_argument("--prepare", metavar="DIR",
                        help="plan the GPU subset into DIR (needs BIN_DIR's parc), run nothing")
    parser.add_argument("--run-prepared", metavar="DIR",
                        help="train the plans of a --prepare DIR with --parrun")
    parser.add_argument("--parrun", help="the parrun to use with --run-prepared")
    parser.add_argument("--parrun-args", default="",
                        help="extra parrun arguments with --run-prepared, e.g. '--backend=cuda'")
    parser.add_argument("--loss-rtol", type=float, default=TOLERANCE["fp32"][0],
                        help="--run-prepared's relative loss tolerance")
    parser.add_argument("--case-timeout", type=float, default=180,
                        help="seconds one parrun may take with --run-prepared")
    # argparse takes a separate value that starts with "--" for an option: glue it on.
    argv = sys.argv[1:]
    for i, arg in enumerate(argv[:-1]):
        if arg == "--parrun-args":
            argv[i:i + 2] = [f"--parrun-args={argv[i + 1]}"]
            break
    args = parser.parse_args(argv)
    if args.prepare and args.run_prepared:
        parser.error("--prepare and --run-prepared are separate steps")
    if args.run_prepared:
        if not args.parrun:
            parser.error("--run-prepared needs --parrun")
        return run_prepared(args)
    if not args.bin_dir:
        parser.error("BIN_DIR is required unless --run-prepared")
    return prepare(args) if args.prepare else run_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
