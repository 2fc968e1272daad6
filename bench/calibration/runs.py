#!/usr/bin/env python3
"""Published training runs -> .par files -> parc --report=json -> measured vs predicted.

Reads a runs file in the schema of published-runs.json (model, hardware, parallel, measured,
derived_step_time_s per row), writes each row as a .par program, runs parc on it and prints
one table row per run, the mean absolute percentage error (MAPE) overall and per group, and
for every sweep (rows of one group and one model) the rank correlation of the predicted and
measured per-GPU throughput and how far the predicted best is from the measured best.

Fields a paper leaves out are filled the way the paper's framework would run them, never
from the measured figure: an unknown micro-batch size or chunk count is the fastest one that
fits by parc's own estimate (what a tuned run does), the vocabulary of a GPT is 51200 and of
a Llama 32000, the inter-node network of a DGX A100 is 8 HDR adapters and of an H100 8 NDR.
Standard library only.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

GPU_KINDS = [  # (pattern, kind, default adapter Gb/s)
    (r"l40s", "l40s", 200),
    (r"b200", "b200", 400),
    (r"h200", "h200", 400),
    (r"h100.*pcie|pcie.*h100", "h100_pcie", 400),
    (r"h100|gh200|h800", "h100_sxm", 400),
    (r"a100.*40\s*gb|a100-40|a100_40", "a100_40gb", 200),
    (r"a100|a800", "a100_80gb", 200),
]


def text(value):
    return "" if value is None else str(value)


def lower_join(*values):
    return " ".join(text(v) for v in values).lower()


def year_of(row):
    """The year of the run's source: a year in its citation or id, or an arXiv id's YYMM."""
    cited = text(row.get("source")) + " " + text(row.get("id")) + " " + text(row.get("year"))
    years = [int(y) for y in re.findall(r"(?<!\d)(20[12]\d)(?!\d)", cited)]
    years += [2000 + int(y) for y in re.findall(r"arxiv[: ]*(\d\d)[01]\d\.\d{4,5}", cited.lower())]
    return min(years) if years else None


def gpu_kind(hardware):
    name = lower_join(hardware.get("gpu"), hardware.get("gpu_kind"))
    for pattern, kind, gbps in GPU_KINDS:
        if re.search(pattern, name):
            return kind, gbps
    return None, 200


def number(value):
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    match = re.search(r"[\d.]+(?:e[+-]?\d+)?", str(value).lower())
    return float(match.group(0)) if match else None


def inter_node(hardware, default_gbps, gpus_per_node):
    """Adapter bandwidth in Gb/s and adapters per node from the hardware's description."""
    desc = lower_join(hardware.get("inter_node"), hardware.get("network"))
    gbps = default_gbps
    match = re.search(r"(\d+)\s*g(?:b(?:it)?|bps)?(?:/s)?\b", desc)
    if match:
        gbps = float(match.group(1))
    elif "ndr" in desc:
        gbps = 400
    elif "hdr" in desc:
        gbps = 200
    nics = number(hardware.get("nics_per_node")) or number(hardware.get("nics"))
    match = re.search(r"(\d+)\s*(?:x\s*)?(?:adapters|nics|hcas|rails|ports)", desc) or \
        re.search(r"(?:adapters|nics|hcas|rails)\s*(?:per node)?\s*[:=]?\s*(\d+)", desc)
    if not nics and match:
        nics = int(match.group(1))
    if not nics and "per gpu" in desc:
        nics = gpus_per_node
    return gbps, int(nics or gpus_per_node)


def architecture(model):
    arch = lower_join(model.get("arch"), model.get("family"), model.get("name"))
    llama = any(w in arch for w in ("llama", "mistral", "qwen", "swiglu", "rmsnorm", "gqa",
                                    "mixtral", "gemma"))
    return {
        "swiglu": "swiglu" in arch or (llama and "gelu" not in arch),
        "rmsnorm": "rmsnorm" in arch or (llama and "layernorm" not in arch),
        "rope": "rope" in arch or (llama and "learned" not in arch),
        "llama": llama,
    }


def schedule_of(parallel, pp):
    desc = lower_join(parallel.get("schedule"))
    chunks = number(parallel.get("virtual_stages")) or number(parallel.get("chunks"))
    if pp <= 1:
        return ["1f1b"]
    if "gpipe" in desc:
        return ["gpipe"]
    if "interleav" in desc:
        if chunks and chunks > 1:
            return [f"interleaved(chunks = {int(chunks)})"]
        if chunks == 1:
            return ["1f1b"]
        match = re.search(r"(\d+)\s*chunks", desc)
        if match:
            return [f"interleaved(chunks = {match.group(1)})"]
        return None  # chunk count unknown: every one that divides the layers
    if chunks and chunks > 1:
        return [f"interleaved(chunks = {int(chunks)})"]
    return ["1f1b"]


def recompute_of(parallel, year):
    """The recompute a run used; None when the row does not say."""
    value = parallel.get("recompute", parallel.get("activation_checkpointing"))
    desc = lower_join(value)
    if value is True or "selective" in desc and "full" not in desc:
        return "full" if value is True else "selective"
    if "full" in desc or desc.strip() in ("true", "yes", "on", "all layers"):
        return "full"
    if desc.strip() in ("none", "no", "false", "off") or value is False:
        return "none"
    # Before Korthikanti et al. (2022) introduced selective recompute, Megatron-LM and
    # DeepSpeed recomputed whole layers.
    if year is not None and year <= 2021:
        return "full"
    return None


def zero_of(parallel):
    zero = number(parallel.get("zero"))
    desc = lower_join(parallel.get("scheme"), parallel.get("zero"), parallel.get("sharding"))
    if zero is None:
        if "zero-3" in desc or "zero3" in desc or "fsdp" in desc or "full_shard" in desc:
            zero = 3
        elif "zero-2" in desc or "shard_grad_op" in desc:
            zero = 2
        elif "zero-1" in desc or "distributed optimizer" in desc:
            zero = 1
        else:
            zero = 0
    return int(zero)


class Row:
    """One published run as parc sees it, or the reason it cannot be written."""

    def __init__(self, raw):
        self.raw = raw
        self.id = text(raw.get("id")) or "?"
        self.group = text(raw.get("group")) or self.id
        self.problem = None
        try:
            self._parse()
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            self.problem = f"cannot read the row: {error!r}"

    def _parse(self):
        model, hw, par = self.raw["model"], self.raw["hardware"], self.raw["parallel"]
        self.year = year_of(self.raw)
        arch = architecture(model)
        self.layers = int(number(model["layers"]))
        self.hidden = int(number(model["hidden"]))
        self.heads = int(number(model["heads"]))
        kv = (number(model.get("kv_heads")) or number(model.get("num_query_groups")) or
              number(model.get("query_groups")))
        self.kv_heads = int(kv) if kv else self.heads
        ffn = number(model.get("ffn"))
        if not ffn:
            ffn = 4 * self.hidden if not arch["swiglu"] else 256 * math.ceil(8 * self.hidden / 3 / 256)
        self.ffn = int(ffn)
        self.seq = int(number(model["seq"]))
        vocab = number(model.get("vocab"))
        self.vocab = int(vocab) if vocab else (32000 if arch["llama"] else 51200)
        self.arch = arch
        self.gpus = int(number(hw["gpus"]))
        self.gpus_per_node = int(number(hw.get("gpus_per_node")) or 8)
        self.gpus_per_node = min(self.gpus_per_node, self.gpus)
        self.nodes = max(1, math.ceil(self.gpus / self.gpus_per_node))
        self.kind, default_gbps = gpu_kind(hw)
        self.peak = number(hw.get("peak_tflops_16bit")) or number(hw.get("peak_tflops"))
        self.adapter_gbps, self.nics = inter_node(hw, default_gbps, self.gpus_per_node)
        tp = number(par.get("tp")) or number(par.get("model_parallel_size")) or 1
        pp = number(par.get("pp")) or 1
        self.tp, self.pp = int(tp), int(pp)
        self.dp = self.gpus // (self.tp * self.pp)
        self.global_batch = int(number(par["global_batch"]))
        mb = number(par.get("micro_batch"))
        self.micro_batches = [int(mb)] if mb else None
        self.schedules = schedule_of(par, self.pp)
        self.recompute = recompute_of(par, self.year)
        self.sp = bool(par.get("sequence_parallel")) or "sequence" in lower_join(par.get("tp_comm"))
        self.zero = zero_of(par)
        precision = lower_join(self.raw.get("precision"), par.get("precision"),
                               hw.get("precision"), par.get("mixed_precision"))
        self.dtype = "fp16" if "fp16" in precision else "bf16"
        # FSDP's PURE mixed precision (and DeepSpeed's bf16 gradients) reduce in the dtype, and
        # so does DeepSpeed's ZeRO-3 by default: its stage 3 optimizer accumulates and
        # reduce-scatters the gradients in the model's dtype (gradient_accumulation_dtype and
        # communication_data_type default to it, deepspeed/runtime/zero/stage3.py).
        engine = lower_join(par.get("scheme"), par.get("framework"), self.raw.get("framework"),
                            self.raw.get("quality"), self.raw.get("notes"))
        deepspeed_zero3 = self.zero == 3 and "deepspeed" in engine
        half_grads = "pure" in precision or "bf16 grad" in precision or deepspeed_zero3
        self.grad_dtype = "bf16" if half_grads else "fp32"
        # Megatron's GPT of 2021-2022 used its unfused softmax attention and dropout 0.1.
        attn = lower_join(par.get("attention"), model.get("attention"), self.raw.get("notes"))
        old = self.year is not None and self.year <= 2022
        self.attention = "flash" if "flash" in attn or not old else "standard"
        self.dropout = 0.1 if old and not arch["llama"] else 0
        self.measured = self._measured()
        if self.measured is None:
            self.problem = "no measured step time, tokens/s, TFLOP/s or MFU"

    def _measured(self):
        m = self.raw.get("measured") or {}
        for key in ("step_time_s", "iteration_time_s"):
            if number(m.get(key)):
                return float(number(m.get(key)))
        if number(self.raw.get("derived_step_time_s")):
            return float(number(self.raw["derived_step_time_s"]))
        tokens = self.global_batch * self.seq
        if number(m.get("tokens_per_s")):
            return tokens / number(m["tokens_per_s"])
        if number(m.get("tokens_per_s_per_gpu")):
            return tokens / (number(m["tokens_per_s_per_gpu"]) * self.gpus)
        if number(m.get("samples_per_s")):
            return self.global_batch / number(m["samples_per_s"])
        self.flops_based = True
        return None

    def candidates(self):
        """Every .par variant of the run: one, or one per unknown micro-batch and chunk count."""
        micro = self.micro_batches
        if micro is None:
            per_replica = self.global_batch // max(self.dp, 1)
            micro = [b for b in (1, 2, 4, 8, 16) if per_replica % b == 0] or [1]
        schedules = self.schedules
        if schedules is None:
            per_stage = self.layers // self.pp
            schedules = ["1f1b"] + [f"interleaved(chunks = {v})" for v in range(2, per_stage + 1)
                                    if per_stage % v == 0 and v <= 8]
        recomputes = [self.recompute] if self.recompute else ["none", "selective", "full"]
        for b in micro:
            for schedule in schedules:
                for recompute in recomputes:
                    yield b, schedule, recompute

    def par(self, micro_batch, schedule, recompute):
        m = [f"# {self.id}: {text(self.raw.get('source'))[:150]}",
             f"model m {{",
             f"  dtype = {self.dtype}; vocab = {self.vocab}; seq = {self.seq}",
             f"  hidden = {self.hidden}; heads = {self.heads}; kv_heads = {self.kv_heads}; ffn = {self.ffn}",
             f"  norm = {'rmsnorm' if self.arch['rmsnorm'] else 'layernorm'}; "
             f"mlp = {'swiglu' if self.arch['swiglu'] else 'gelu'}; "
             f"position = {'rope' if self.arch['rope'] else 'learned'}",
             f"  attention = {self.attention}; dropout = {self.dropout}",
             f"  layer embed : embedding",
             f"  layer block : transformer x {self.layers}",
             f"  layer head : lm_head{'' if self.arch['llama'] else ' tied(embed)'}",
             "}",
             "cluster c {",
             f"  nodes = {self.nodes}; gpus_per_node = {self.gpus_per_node}"]
        if self.kind:
            m.append(f"  gpu {{ kind = {self.kind} }}")
        else:
            m.append(f"  gpu {{ memory = 80 GiB; flops = {self.peak or 312} TFLOPS }}")
            m.append("  intra_node { bandwidth = 300 GB/s; latency = 3.4 us }")
        if self.nodes > 1:
            m.append(f"  inter_node {{ bandwidth = {self.adapter_gbps:g} Gb/s; latency = 5 us; "
                     f"nics = {self.nics} }}")
        m += ["}",
              "parallel for m on c {",
              f"  tp = {self.tp}; pp = {self.pp}; dp = {self.dp}",
              f"  micro_batch = {micro_batch}; global_batch = {self.global_batch}",
              f"  schedule = {schedule}; zero = {self.zero}; recompute = {recompute}",
              f"  sequence_parallel = {'true' if self.sp and self.tp > 1 else 'false'}",
              "}",
              f"train {{ grad_dtype = {self.grad_dtype} }}"]
        return "\n".join(m) + "\n"


def run_parc(parc, source, workdir, name):
    path = os.path.join(workdir, name + ".par")
    with open(path, "w") as f:
        f.write(source)
    start = time.perf_counter()
    proc = subprocess.run([parc, path, "--report=json"], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None, proc.stderr.strip().splitlines()[:1], elapsed
    return report, None, elapsed


def predict(parc, row, workdir):
    """The fastest fitting variant's report (or the fastest one when none fits)."""
    best, best_fit, errors, times = None, None, [], []
    for i, variant in enumerate(row.candidates()):
        report, error, elapsed = run_parc(parc, row.par(*variant), workdir, f"{row.id}-{i}")
        times.append(elapsed)
        if report is None or not report.get("step_time_estimate_s"):
            errors += error or ["no step time"]
            continue
        key = report["step_time_estimate_s"]
        if best is None or key < best["step_time_estimate_s"]:
            best = report
        if report.get("fits") and (best_fit is None or key < best_fit["step_time_estimate_s"]):
            best_fit = report
    return best_fit or best, errors, times


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else float("nan")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", default=os.path.join(here, "published-runs.json"))
    ap.add_argument("--parc", default=os.environ.get("PARC", os.path.join(root, "build/bin/parc")))
    ap.add_argument("--keep", help="write the .par files here and keep them")
    ap.add_argument("--json", help="also write the per-row results to this file")
    args = ap.parse_args()
    with open(args.runs) as f:
        data = json.load(f)
    rows = [Row(r) for r in (data["rows"] if isinstance(data, dict) else data)]
    workdir = args.keep or tempfile.mkdtemp(prefix="parc-calibration-")
    os.makedirs(workdir, exist_ok=True)

    results, times = [], []
    header = f"{'run':34} {'gpus':>5} {'tp':>3} {'pp':>3} {'dp':>4} {'mb':>3} {'sched':>6} " \
             f"{'measured':>9} {'parc':>9} {'error':>7} {'MFU':>6}  note"
    print(header)
    print("-" * len(header))
    for row in rows:
        if row.problem:
            print(f"{row.id:34} {'':>5} {'':>3} {'':>3} {'':>4} {'':>3} {'':>6} {'':>9} "
                  f"{'':>9} {'':>7} {'':>6}  skipped: {row.problem}")
            results.append({"id": row.id, "group": row.group, "error": None,
                            "problem": row.problem})
            continue
        report, errors, elapsed = predict(args.parc, row, workdir)
        times += elapsed
        if report is None:
            note = "parc failed: " + (errors[0] if errors else "?")
            print(f"{row.id:34} {row.gpus:>5} {row.tp:>3} {row.pp:>3} {row.dp:>4} {'':>3} "
                  f"{'':>6} {row.measured:>9.3f} {'':>9} {'':>7} {'':>6}  {note}")
            results.append({"id": row.id, "group": row.group, "error": None, "problem": note})
            continue
        predicted = report["step_time_estimate_s"]
        error = (predicted - row.measured) / row.measured
        sched = report["schedule"].replace("interleaved(chunks = ", "i").rstrip(")")
        note = "" if report.get("fits") else "REFUSED: does not fit"
        print(f"{row.id:34} {row.gpus:>5} {row.tp:>3} {row.pp:>3} {row.dp:>4} "
              f"{report['micro_batch']:>3} {sched:>6} {row.measured:>9.3f} {predicted:>9.3f} "
              f"{100 * error:>+6.1f}% {100 * report['mfu_estimate']:>5.1f}%  {note}")
        tokens = row.global_batch * row.seq
        results.append({"id": row.id, "group": row.group, "model": (row.layers, row.hidden),
                        "measured": row.measured, "predicted": predicted, "error": error,
                        "fits": bool(report.get("fits")), "gpus": row.gpus,
                        "measured_tps_gpu": tokens / row.measured / row.gpus,
                        "predicted_tps_gpu": tokens / predicted / row.gpus,
                        "breakdown": report.get("step_time_breakdown")})

    scored = [r for r in results if r.get("error") is not None]
    print()
    if scored:
        mape = sum(abs(r["error"]) for r in scored) / len(scored)
        bias = sum(r["error"] for r in scored) / len(scored)
        print(f"MAPE {100 * mape:.1f}% over {len(scored)} runs (mean signed error "
              f"{100 * bias:+.1f}%); {len(results) - len(scored)} rows not predicted; "
              f"{sum(1 for r in scored if not r['fits'])} refused as not fitting")
        groups = {}
        for r in scored:
            groups.setdefault(r["group"], []).append(r)
        for name, members in groups.items():
            g = sum(abs(r["error"]) for r in members) / len(members)
            print(f"  {name:32} {len(members):>3} runs  MAPE {100 * g:5.1f}%")
        sweeps = {}
        for r in scored:
            sweeps.setdefault((r["group"], r["model"]), []).append(r)
        lines = []
        for (name, model), members in sweeps.items():
            if len(members) < 3:
                continue
            rho = spearman([r["measured_tps_gpu"] for r in members],
                           [r["predicted_tps_gpu"] for r in members])
            pick = max(members, key=lambda r: r["predicted_tps_gpu"])
            best = max(members, key=lambda r: r["measured_tps_gpu"])
            gap = 1 - pick["measured_tps_gpu"] / best["measured_tps_gpu"]
            lines.append(f"  {name:32} {len(members):>3} runs of {model[0]} x {model[1]}: "
                         f"rank correlation {rho:+.2f}, parc's pick {100 * gap:.1f}% slower "
                         f"than the measured best")
        if lines:
            print("sweeps (one model, several mappings; per-GPU throughput):")
            print("\n".join(lines))
    if times:
        print(f"parc --report=json: {1000 * sum(times) / len(times):.1f} ms per run on average "
              f"({len(times)} runs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
