"""The PyTorch side of bench/vs-pytorch.sh: the model of a parc `.par` file (GPT blocks as parc
lowers them: pre-layernorm, separate q, k and v projections with biases, causal softmax
attention, exact GELU MLP, learned positions, final layernorm, head tied to the embedding),
trained with torch.optim.AdamW and global-norm clipping on synthetic tokens, micro-batches
accumulated to the global batch, fp32. Prints one line per step: `step N seconds S`.

The model, batch and optimizer come from a compiled 1-rank plan (`--plan DIR`, what parc wrote
for the same `.par`), so that both sides train the same thing; a plan that asks for what this
trainer does not model (another norm, MLP or position, grouped keys, experts, recompute, another
optimizer) is refused with the reason. `--describe` checks the plan and prints the tokens of
one step.
"""

import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn, eps):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        b, s, h = x.shape
        y = self.ln1(x)
        split = lambda t: t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        q, k, v = split(self.q(y)), split(self.k(y)), split(self.v(y))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.position = nn.Embedding(args.seq, args.hidden)
        self.blocks = nn.ModuleList(
            Block(args.hidden, args.heads, args.ffn, args.eps) for _ in range(args.blocks))
        self.norm = nn.LayerNorm(args.hidden, eps=args.eps)
        # Megatron's initialisation, as parc's plans ask: normal(0, 0.02), the output
        # projections scaled by 1 / sqrt(2 blocks), zero biases.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                scaled = name.endswith(("proj.weight", "down.weight"))
                nn.init.normal_(p, 0.0, 0.02 / (math.sqrt(2 * args.blocks) if scaled else 1))

    def forward(self, tokens, labels):
        x = self.embed(tokens) + self.position.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.embed.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


# The ops of the plans of the model above, forward and backward; any other is refused.
GPT_OPS = {op + suffix for op in ("attention", "bias_add", "cross_entropy", "embedding", "gelu",
                                  "layernorm", "matmul", "position_embedding", "residual_add")
           for suffix in ("", "_bwd")}
GPT_MODEL = {"norm": "layernorm", "mlp": "gelu", "position": "learned", "dtype": "fp32",
             "tied_embeddings": True}


def plan_ops(value, found):
    if isinstance(value, dict):
        if isinstance(value.get("op"), str):
            found.add(value["op"])
        for item in value.values():
            plan_ops(item, found)
    elif isinstance(value, list):
        for item in value:
            plan_ops(item, found)
    return found


def from_plan(directory, args):
    """Sets the model, batch and optimizer arguments from a compiled plan, or exits naming what
    in it this trainer does not model."""
    path = os.path.join(directory, "rank-00000.json")
    try:
        with open(path) as file:
            plan = json.load(file)
        model, parallel, train = plan["model"], plan["parallel"], plan["train"]
        world = plan["world"]
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"{path}: not a parc plan ({error})")
    problems = [f"{key} is {model.get(key)!r}, not {want!r}" for key, want in GPT_MODEL.items()
                if model.get(key) != want]
    if world != 1:
        problems.append(f"the plan is for {world} ranks, not 1")
    if model.get("kv_heads") != model.get("heads"):
        problems.append(f"kv_heads {model.get('kv_heads')} differs from heads {model.get('heads')}")
    if parallel.get("recompute") != "none":
        problems.append(f"recompute is {parallel.get('recompute')!r}, not 'none'")
    if train.get("optimizer") != "adam":
        problems.append(f"the optimizer is {train.get('optimizer')!r}, not 'adam'")
    other_ops = sorted(plan_ops(plan["chunks"], set()) - GPT_OPS)
    if other_ops:
        problems.append("its ops include " + ", ".join(other_ops))
    if problems:
        raise SystemExit(f"{path}: the PyTorch side does not model this plan: " +
                         "; ".join(problems))
    # The embedding has the padded vocabulary's rows, as parrun's; tokens are drawn from the
    # model's own vocabulary.
    args.vocab, args.token_vocab = model["padded_vocab"], model["vocab"]
    args.seq, args.hidden, args.heads = model["seq"], model["hidden"], model["heads"]
    args.blocks, args.ffn = model["layers"], model["ffn"]
    args.micro_batch, args.global_batch = parallel["micro_batch"], parallel["global_batch"]
    args.lr, args.betas, args.adam_eps = train["lr"], tuple(train["betas"]), train["eps"]
    args.weight_decay, args.grad_clip = train["weight_decay"], train["grad_clip"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="a directory of parc's plans for 1 rank")
    parser.add_argument("--describe", action="store_true",
                        help="check the plan and print the tokens of one step")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eps", type=float, default=1e-5, help="the layernorms' epsilon")
    args = parser.parse_args()
    from_plan(args.plan, args)
    if args.describe:
        print(args.global_batch * args.seq)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    model = GPT(args)
    # Weight decay on the matrices only, as parc's optimizer step applies it.
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2]},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=args.betas, eps=args.adam_eps,
                                  weight_decay=args.weight_decay)
    microbatches = args.global_batch // args.micro_batch
    generator = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        batches = [torch.randint(0, args.token_vocab, (args.micro_batch, args.seq + 1),
                                 generator=generator) for _ in range(microbatches)]
        start = time.perf_counter()
        for batch in batches:
            loss = model(batch[:, :-1], batch[:, 1:]) / microbatches
            loss.backward()
        if args.grad_clip > 0:  # 0: no clipping, as in the plan
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        seconds = time.perf_counter() - start
        print(f"step {step + 1} seconds {seconds:.6f} loss {loss.item() * microbatches:.4f}",
              flush=True)
        if not math.isfinite(loss.item()):
            raise SystemExit("the loss is not finite")


if __name__ == "__main__":
    main()
