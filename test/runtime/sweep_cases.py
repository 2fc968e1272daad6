"""The cases of the equivalence sweep (sweep.py): the model template, the mappings and features
each case sets, and the single-rank reference each is compared with."""
import itertools

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
    # Experts narrower than hidden (memory_sweep.py: at tp 4 the up projection's backward is
    # the experts' widest moment).
    "moe-narrow": "  experts = 4\n  top_k = 2\n  moe_ffn = hidden / 2\n  aux_loss = 0.01\n",
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
