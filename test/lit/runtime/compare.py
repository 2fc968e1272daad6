#!/usr/bin/env python3
"""Compares two `parrun --dump-weights` files: the per-step losses and every parameter.

    compare.py REFERENCE.json OTHER.json [--loss-rtol R] [--weight-tol T] [--weights-only]

Losses must agree to R relative (default 1e-10), unless --weights-only (runs of different
lengths: weights after skipped steps against those of no step). A parameter agrees when
max|a - b| <= T * max(max|a|, 1e-3), T default 1e-9: relative to the tensor's scale, since an
element that Adam moved from near zero has no meaningful relative error of its own, and with a
floor for tensors that stay at rounding noise (a key bias's gradient is zero analytically: the
softmax does not see it, so Adam only amplifies rounding noise there).

Adam divides by sqrt(v) + eps, so an element whose gradient is near eps moves by up to lr/eps
times its gradient's rounding error: with lr 1e-2 and eps 1e-8 a 1e-16 difference becomes
1e-10, and deeper models can need --weight-tol 1e-8 although every loss agrees to 1e-15 (SGD
runs of the same mappings agree to 1e-12).

Both files must also have max_replica_difference 0 (replicated copies identical). Prints one
line per check; exits 1 when any check fails.
"""
import argparse
import json
import math
import sys


def load(path):
    with open(path) as f:
        dump = json.load(f)
    if dump.get("format") != "parrun-weights/1":
        sys.exit(f"{path}: not a parrun --dump-weights file")
    return dump


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reference")
    parser.add_argument("other")
    parser.add_argument("--loss-rtol", type=float, default=1e-10)
    parser.add_argument("--weight-tol", type=float, default=1e-9)
    parser.add_argument("--weights-only", action="store_true")
    args = parser.parse_args()
    ref, other = load(args.reference), load(args.other)
    failed = False

    for name, dump in (("reference", ref), ("other", other)):
        if dump["max_replica_difference"] != 0:
            print(f"replicas differ in {name}: max difference {dump['max_replica_difference']:.3e}")
            failed = True

    if args.weights_only:
        pass
    elif len(ref["losses"]) != len(other["losses"]):
        print(f"step counts differ: {len(ref['losses'])} vs {len(other['losses'])}")
        return 1
    worst = 0.0
    compared = [] if args.weights_only else list(zip(ref["losses"], other["losses"]))
    for step, (a, b) in enumerate(compared, start=1):
        if not (math.isfinite(a) and math.isfinite(b)):
            print(f"step {step}: non-finite loss {a} vs {b}")
            return 1
        rel = abs(a - b) / max(abs(a), 1e-300)
        worst = max(worst, rel)
        if rel > args.loss_rtol:
            print(f"step {step}: loss {a!r} vs {b!r}, relative difference {rel:.3e}")
            failed = True
    if not args.weights_only:
        print(f"losses match over {len(ref['losses'])} steps (max relative difference "
              f"{'below' if worst <= args.loss_rtol else 'ABOVE'} {args.loss_rtol:g})")

    ref_params, other_params = ref["params"], other["params"]
    if set(ref_params) != set(other_params):
        only = sorted(set(ref_params) ^ set(other_params))
        print(f"parameter names differ: {', '.join(only[:5])}")
        return 1
    mismatched = 0
    for name in sorted(ref_params):
        a, b = ref_params[name], other_params[name]
        if a["shape"] != b["shape"]:
            print(f"{name}: shape {a['shape']} vs {b['shape']}")
            mismatched += 1
            continue
        scale = max(max(abs(x) for x in a["data"]), 1e-3)
        diff = max(abs(x - y) for x, y in zip(a["data"], b["data"]))
        if not diff <= args.weight_tol * scale:
            print(f"{name}: max difference {diff:.3e} at scale {scale:.3e}")
            mismatched += 1
    if mismatched:
        failed = True
    print(f"weights {'match' if not mismatched else 'DIFFER'}: {len(ref_params) - mismatched} of "
          f"{len(ref_params)} parameters within {args.weight_tol:g} of their scale")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
