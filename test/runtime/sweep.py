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
import itertools
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

MODEL = """\
model small {{
  dtype  = fp32
  vocab  = {vocab}
  seq    = 32
  hidden = 64
  heads  = 4
{kv_line}{arch_lines}{attention_line}  ffn    = 4 * hidden

  layer embed : embedding
  layer block : transformer x {blocks}
  layer head  : lm_head tied(embed)
}}

train {{
  optimizer    = adam
  eps          = {eps}
  lr           = 1e-2
  weight_decay = 0.1
  warmup_steps = 2
  steps        = 3
  seed         = 7
}}

cluster box {{
  nodes         = 1
  gpus_per_node = {world}
  gpu {{ memory = 2 GiB; flops = 50 GFLOPS }}
  intra_node {{ bandwidth = 10 GB/s; latency = 2 us }}
}}

parallel for small on box {{
  tp = {tp}
  pp = {pp}
  dp = {dp}
  cp = {cp}
  ep = {ep}
  micro_batch       = 1
  global_batch      = 8
  schedule          = {schedule_text}
  zero              = {zero}
  recompute         = {recompute}
  sequence_parallel = {sp}
}}
"""

SCHEDULES = ("gpipe", "1f1b", "interleaved")
MAPPINGS = [(tp, pp, dp) for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in (1, 2)
            if tp * pp * dp <= 8]
# "mixed" (--precision=mixed: fp32 storage, fp64 gradients and master weights) rounds its
# activations as fp32 does.
TOLERANCE = {"fp64": (1e-10, 1e-10), "fp32": (1e-5, 1e-5), "mixed": (1e-5, 1e-5)}
# Adam moves an element by lr * g / (sqrt(v) + eps): where the gradient is at rounding level
# (a key bias's is zero analytically) any rounding difference becomes a step of up to lr. fp64
# rounding is small enough for the usual eps; fp32 needs eps 1e-3 (an element moves at most
# lr / eps = 10 times its gradient's rounding error) to meet 1e-5.
ADAM_EPS = {"fp64": "1e-8", "fp32": "1e-3", "mixed": "1e-3"}

# Buckets of about 1 KiB, so that the small models start their data-parallel gradient
# all-reduces during the backward (GradSyncOverlap.h) and every dp mapping checks that path;
# parrun's default buckets (25 MiB) exceed these models' gradients.
GRAD_BUCKET_ARGS = ["--grad-bucket-mb", "0.001"]


# Model fields an imported Hugging Face config brings (docs/interop.md), on top of GPT's or
# Llama's block: Qwen2's q/k/v-only biases with heads wider than hidden / heads and its rotary
# base and norm epsilon; GPT-2's learned table longer than the sequence, with narrow heads.
VARIANTS = {
    "qwen": "  bias = qkv\n  head_dim = 24\n  rope_theta = 1e6\n  norm_eps = 1e-6\n",
    "gpt2": "  head_dim = 8\n  max_positions = 48\n",
    # Mixture of experts on every block (ep = 1): 4 experts, 2 per token, the load-balancing
    # loss; and with a shared expert and top-k weights left unnormalised.
    "moe": "  experts = 4\n  top_k = 2\n  moe_ffn = 2 * hidden\n  aux_loss = 0.01\n",
    "moe-shared": "  experts = 4\n  top_k = 2\n  moe_ffn = hidden\n  shared_experts = 1\n"
                  "  normalize_top_k = false\n  aux_loss = 0.1\n",
}


class Case:
    def __init__(self, tp, pp, dp, schedule, zero=0, recompute="none", sp=False, kv_heads=4,
                 precision="fp64", comm="local", llama=False, variant=None, vocab=512,
                 attention="flash", cp=1, ep=1):
        self.tp, self.pp, self.dp, self.cp = tp, pp, dp, cp
        # Expert parallelism, carved from dp: the experts split over ep ranks.
        self.ep = ep
        self.schedule, self.zero, self.recompute, self.sp = schedule, zero, recompute, sp
        self.kv_heads, self.precision, self.comm = kv_heads, precision, comm
        # Llama's block: rmsnorm, swiglu and rotary positions instead of GPT's layernorm, gelu
        # and learned positions.
        self.llama = llama
        self.variant = variant
        # 512 needs no padding at tp 1, 2 or 4; others are padded to a multiple of 128 * tp, and
        # the padding must change nothing.
        self.vocab = vocab
        # FlashAttention (the language's default) or standard attention, which keeps the scores.
        self.attention = attention
        # Interleaving 2 chunks over pp 4 needs 8 blocks; the reference then has 8 as well.
        self.blocks = 8 if schedule == "interleaved" and pp == 4 else 4

    @property
    def world(self):
        return self.tp * self.pp * self.dp * self.cp

    def model_key(self):
        return (self.blocks, self.kv_heads, self.precision, self.llama, self.variant, self.vocab,
                self.attention)

    def name(self):
        parts = [f"tp{self.tp} pp{self.pp} dp{self.dp}" + (f" cp{self.cp}" if self.cp > 1 else "")
                 + (f" ep{self.ep}" if self.ep > 1 else "") + f" {self.schedule}"]
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.sp:
            parts.append("sp")
        if self.kv_heads != 4:
            parts.append(f"kv{self.kv_heads}")
        if self.llama:
            parts.append("llama")
        if self.variant:
            parts.append(self.variant)
        if self.blocks != 4:
            parts.append(f"{self.blocks}blk")
        if self.vocab != 512:
            parts.append(f"vocab{self.vocab}")
        if self.attention != "flash":
            parts.append(self.attention)
        parts.append(self.precision)
        if self.comm != "local":
            parts.append(self.comm)
        return " ".join(parts)

    def par_text(self):
        schedule_text = "interleaved(chunks = 2)" if self.schedule == "interleaved" else self.schedule
        llama_lines = "  norm     = rmsnorm\n  mlp      = swiglu\n  position = rope\n"
        return MODEL.format(eps=ADAM_EPS[self.precision], kv_line=f"  kv_heads = {self.kv_heads}\n" if self.kv_heads != 4 else "",
                            arch_lines=(llama_lines if self.llama else "") +
                            VARIANTS.get(self.variant, ""),
                            attention_line=("" if self.attention == "flash"
                                            else f"  attention = {self.attention}\n"),
                            blocks=self.blocks, vocab=self.vocab, world=self.world, tp=self.tp,
                            pp=self.pp,
                            dp=self.dp, cp=self.cp, ep=self.ep, schedule_text=schedule_text, zero=self.zero,
                            recompute=self.recompute, sp="true" if self.sp else "false")


def build_cases(with_mpi):
    cases = []
    for (tp, pp, dp), schedule in itertools.product(MAPPINGS, SCHEDULES):
        if schedule == "interleaved" and pp == 1:
            continue
        cases.append(Case(tp, pp, dp, schedule))
    for i, (zero, recompute, sp) in enumerate(
            itertools.product(range(4), ("none", "selective", "full"), (False, True))):
        if (zero, recompute, sp) == (0, "none", False):
            continue
        cases.append(Case(2, 2, 2, SCHEDULES[i % 3], zero, recompute, sp))
    for i, (tp, pp, dp) in enumerate(MAPPINGS):
        cases.append(Case(tp, pp, dp, "1f1b" if pp == 1 else SCHEDULES[1 + i % 2], kv_heads=2))
    # The features again where the mapping differs: tp 4 for sequence parallelism, pp 4 and
    # gpipe for recompute, dp 2 beside other tp/pp for every ZeRO stage.
    cases += [
        Case(4, 2, 1, "1f1b", 0, "selective", True),
        Case(4, 1, 2, "gpipe", 3, "full", True),
        Case(2, 4, 1, "interleaved", 0, "full", True),
        Case(2, 1, 2, "1f1b", 2, "selective", True, kv_heads=2),
        Case(1, 4, 2, "gpipe", 1, "full"),
        Case(1, 2, 2, "interleaved", 3, "selective"),
        Case(1, 1, 2, "1f1b", 2, "none"),
    ]
    # Llama's block (rmsnorm, swiglu, rope) across the axes and features.
    cases += [
        Case(2, 1, 1, "1f1b", llama=True),
        Case(1, 2, 1, "1f1b", kv_heads=2, llama=True),
        Case(1, 1, 2, "1f1b", 2, llama=True),
        Case(2, 2, 2, "interleaved", 1, "selective", True, kv_heads=2, llama=True),
        Case(4, 1, 2, "gpipe", 3, "full", True, kv_heads=1, llama=True),
        Case(2, 2, 2, "1f1b", kv_heads=2, precision="fp32", llama=True),
    ]
    # Imported models' fields across tp (column and row shards of the biases and wide heads),
    # pp, dp with ZeRO, recompute and sequence parallelism.
    cases += [
        Case(2, 2, 2, "1f1b", 1, "selective", True, kv_heads=2, llama=True, variant="qwen"),
        Case(4, 1, 2, "gpipe", 3, "full", kv_heads=1, llama=True, variant="qwen"),
        Case(2, 2, 2, "interleaved", 2, "full", True, variant="gpt2"),
        Case(4, 1, 1, "1f1b", 0, "selective", variant="gpt2"),
    ]
    # fp32: the arithmetic is the same, only rounding differs.
    cases += [
        Case(2, 2, 2, "1f1b", precision="fp32"),
        Case(2, 2, 2, "interleaved", 3, "selective", True, precision="fp32"),
        Case(4, 2, 1, "gpipe", 0, "full", True, precision="fp32"),
        Case(1, 4, 2, "interleaved", 1, "none", precision="fp32"),
        Case(4, 1, 2, "1f1b", 2, "selective", True, kv_heads=2, precision="fp32"),
        Case(2, 4, 1, "1f1b", 0, "none", precision="fp32"),
    ]
    # Vocabularies that need padding: 256 at tp 4 (padded to 512, so two ranks hold only
    # padding) and GPT-2's 50257 at tp 2 (padded to 50432; 50304 at tp 1).
    cases += [
        Case(4, 1, 2, "1f1b", vocab=256),
        Case(4, 2, 1, "interleaved", 0, "selective", True, vocab=256),
        Case(2, 2, 1, "1f1b", vocab=50257),
    ]
    # Standard attention (the saved probabilities instead of the logsumexp).
    cases += [
        Case(2, 2, 2, "interleaved", 2, "none", True, attention="standard"),
        Case(2, 1, 2, "1f1b", 3, "selective", kv_heads=2, attention="standard", llama=True),
    ]
    # Mixed precision's path (gradients wider than the weights, master weights) on the CPU.
    cases += [
        Case(2, 2, 2, "1f1b", precision="mixed"),
        Case(1, 1, 2, "1f1b", 2, precision="mixed"),
        Case(1, 2, 2, "interleaved", 3, "selective", precision="mixed"),
        Case(4, 1, 2, "gpipe", 1, "none", True, kv_heads=2, precision="mixed", llama=True),
    ]
    # Context parallelism (ring attention over 2 x cp chunks of the 32 positions): cp 2 and 4
    # alone and beside tp, pp and dp, with ZeRO, recompute, sequence parallelism, grouped-query
    # attention and Llama's rotary positions.
    cases += [
        Case(1, 1, 1, "1f1b", cp=2),
        Case(1, 1, 1, "1f1b", cp=4),
        Case(2, 1, 1, "1f1b", cp=2),
        Case(2, 1, 1, "1f1b", cp=4),
        Case(1, 2, 1, "1f1b", cp=2),
        Case(1, 2, 1, "gpipe", cp=4),
        Case(1, 2, 1, "interleaved", cp=2),
        Case(1, 1, 2, "1f1b", cp=2),
        Case(1, 1, 2, "1f1b", cp=4),
        Case(2, 2, 1, "1f1b", cp=2),
        Case(2, 1, 2, "1f1b", cp=2),
        Case(1, 2, 2, "interleaved", cp=2),
        Case(1, 1, 2, "1f1b", 1, cp=2),
        Case(1, 1, 1, "1f1b", 1, cp=4),
        Case(2, 1, 2, "1f1b", 3, cp=2),
        Case(1, 1, 1, "1f1b", 0, "selective", cp=2),
        Case(2, 1, 1, "1f1b", 0, "selective", True, cp=4),
        Case(1, 2, 1, "1f1b", 0, "full", cp=2),
        Case(2, 1, 1, "1f1b", 0, "none", True, cp=2),
        Case(1, 1, 1, "1f1b", kv_heads=2, cp=2),
        Case(2, 1, 1, "1f1b", kv_heads=2, cp=4),
        Case(1, 1, 1, "1f1b", llama=True, cp=2),
        Case(1, 1, 1, "1f1b", kv_heads=2, llama=True, cp=4),
        Case(2, 1, 2, "1f1b", 1, "selective", True, kv_heads=2, llama=True, cp=2),
        Case(1, 2, 1, "1f1b", 0, "full", kv_heads=1, llama=True, cp=2),
        Case(2, 1, 1, "1f1b", precision="fp32", cp=2),
        Case(1, 1, 1, "1f1b", kv_heads=2, precision="fp32", llama=True, cp=4),
        Case(1, 2, 2, "1f1b", 1, "selective", precision="fp32", cp=2),
    ]
    # Mixture-of-experts blocks on one expert-parallel rank beside pp and dp (the experts'
    # gradients reduced over dp, their ZeRO buckets apart), recompute, GELU and SwiGLU experts.
    cases += [
        Case(1, 1, 2, "1f1b", variant="moe"),
        Case(1, 2, 1, "1f1b", variant="moe"),
        Case(1, 2, 2, "interleaved", 1, variant="moe"),
        Case(1, 1, 2, "1f1b", 3, "full", variant="moe-shared"),
        Case(1, 2, 1, "gpipe", 0, "selective", llama=True, variant="moe-shared"),
        Case(1, 2, 2, "1f1b", 2, "full", llama=True, variant="moe"),
        Case(1, 1, 2, "1f1b", 1, precision="fp32", llama=True, variant="moe"),
        # Expert tensor parallelism = tp: column and row slices of every expert, the logits'
        # gradient all-reduced over tp, with and without sequence parallelism.
        Case(2, 1, 1, "1f1b", variant="moe"),
        Case(4, 1, 1, "1f1b", 0, "selective", True, variant="moe"),
        Case(2, 2, 1, "1f1b", 0, "none", True, llama=True, variant="moe-shared"),
        Case(2, 2, 2, "interleaved", 1, "full", True, kv_heads=2, llama=True, variant="moe"),
        Case(2, 1, 2, "gpipe", 3, "selective", variant="moe-shared"),
        Case(2, 2, 2, "1f1b", 2, "none", True, precision="fp32", llama=True, variant="moe"),
    ]
    # Expert parallelism: the experts split over ep ranks carved from dp, the rows exchanged by
    # all-to-all; ep 2 and 4 alone, beside dp (expert dp > 1), ZeRO 1 to 3 (the experts' states
    # sharded over expert dp), tp 2, pp 2, recompute and shared experts.
    cases += [
        Case(1, 1, 2, "1f1b", variant="moe", ep=2),
        Case(1, 1, 4, "1f1b", variant="moe", ep=4),
        Case(1, 1, 4, "1f1b", 1, llama=True, variant="moe", ep=2),
        Case(1, 1, 4, "1f1b", 1, variant="moe-shared", ep=4),
        Case(2, 1, 2, "1f1b", 0, "none", True, llama=True, variant="moe", ep=2),
        Case(1, 2, 2, "1f1b", 0, "full", variant="moe-shared", ep=2),
        Case(2, 2, 2, "interleaved", 1, "selective", True, llama=True, variant="moe", ep=2),
        Case(1, 1, 4, "1f1b", 2, variant="moe", ep=2),
        Case(1, 2, 2, "interleaved", 3, variant="moe", ep=2),
        Case(2, 1, 4, "1f1b", 0, "full", llama=True, variant="moe-shared", ep=4),
    ]
    if with_mpi:
        cases += [
            Case(2, 1, 1, "1f1b", 0, "selective", True, comm="mpi", cp=2),
            Case(1, 2, 1, "1f1b", kv_heads=2, llama=True, comm="mpi", cp=2),
            Case(1, 1, 2, "1f1b", 1, comm="mpi", cp=4),
            Case(2, 2, 2, "interleaved", 3, "selective", True, comm="mpi"),
            Case(2, 2, 2, "1f1b", 1, "full", kv_heads=2, comm="mpi"),
            Case(4, 1, 2, "gpipe", 2, "none", True, comm="mpi"),
            Case(1, 4, 1, "1f1b", comm="mpi"),
            Case(2, 2, 2, "1f1b", 1, "none", True, llama=True, variant="moe", comm="mpi"),
            Case(1, 1, 4, "1f1b", 1, llama=True, variant="moe", comm="mpi", ep=2),
        ]
    return cases


# The GPU sweep's fp32 subset: every axis alone, the schedules, each ZeRO stage, recompute,
# sequence parallelism and grouped-query attention, then mixtures, and Llama's block; small enough to carry and to
# run in about a minute on one GPU.
GPU_CASES = [
    Case(2, 1, 1, "1f1b", precision="fp32"),
    Case(4, 1, 1, "1f1b", precision="fp32"),
    Case(2, 1, 1, "1f1b", sp=True, precision="fp32"),
    Case(1, 2, 1, "1f1b", precision="fp32"),
    Case(1, 2, 1, "interleaved", precision="fp32"),
    Case(1, 4, 1, "gpipe", precision="fp32"),
    Case(1, 4, 1, "interleaved", precision="fp32"),
    Case(1, 1, 2, "1f1b", precision="fp32"),
    Case(1, 1, 2, "1f1b", 1, precision="fp32"),
    Case(1, 1, 2, "1f1b", 2, precision="fp32"),
    Case(1, 1, 2, "1f1b", 3, precision="fp32"),
    Case(2, 2, 1, "1f1b", 0, "selective", precision="fp32"),
    Case(1, 2, 2, "interleaved", 0, "full", precision="fp32"),
    Case(2, 2, 2, "1f1b", precision="fp32"),
    Case(2, 2, 2, "gpipe", 2, "full", True, precision="fp32"),
    Case(2, 2, 2, "interleaved", 3, "selective", True, precision="fp32"),
    Case(2, 2, 2, "1f1b", 1, kv_heads=2, precision="fp32"),
    Case(2, 1, 2, "gpipe", 3, "full", precision="fp32"),
    Case(4, 2, 1, "gpipe", 0, "full", True, precision="fp32"),
    Case(4, 2, 1, "interleaved", kv_heads=2, precision="fp32"),
    Case(1, 4, 2, "interleaved", 1, "none", precision="fp32"),
    Case(4, 1, 2, "1f1b", 2, "selective", True, kv_heads=2, precision="fp32"),
    Case(2, 4, 1, "1f1b", 0, "none", precision="fp32"),
    Case(2, 1, 1, "1f1b", kv_heads=2, precision="fp32", llama=True),
    Case(2, 2, 2, "1f1b", kv_heads=2, precision="fp32", llama=True),
    Case(1, 2, 2, "interleaved", 2, "selective", precision="fp32", llama=True),
    Case(1, 1, 1, "1f1b", precision="fp32", cp=2),
    Case(2, 1, 1, "1f1b", 0, "selective", kv_heads=2, precision="fp32", llama=True, cp=2),
    Case(1, 2, 1, "1f1b", 1, precision="fp32", cp=4),
    # Mixture of experts: the router and the rows routed on the host, the expert GEMMs on the GPU.
    Case(1, 1, 2, "1f1b", 1, precision="fp32", llama=True, variant="moe"),
    # Expert parallelism: the all-to-all over NCCL (or the CUDA local communicator).
    Case(1, 1, 2, "1f1b", 1, precision="fp32", llama=True, variant="moe", ep=2),
]


def references_for(cases):
    """The single-rank run of each model the cases train, keyed by Case.model_key()."""
    references = {}
    for case in cases:
        references.setdefault(case.model_key(), Case(1, 1, 1, "1f1b", kv_heads=case.kv_heads,
                                                      precision=case.precision, llama=case.llama,
                                                      variant=case.variant, vocab=case.vocab,
                                                      attention=case.attention))
        references[case.model_key()].blocks = case.blocks
    return references


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
