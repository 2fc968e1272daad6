"""The PyTorch side of bench/vs-pytorch.sh: the model of a parc `.par` file (GPT blocks as parc
lowers them: pre-layernorm, separate q, k and v projections with biases, causal softmax
attention, exact GELU MLP, learned positions, final layernorm, head tied to the embedding),
trained with torch.optim.AdamW and global-norm clipping on synthetic tokens, micro-batches
accumulated to the global batch, fp32. Prints one line per step: `step N seconds S`.
"""

import argparse
import math
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


def main():
    parser = argparse.ArgumentParser()
    for name in ("vocab", "seq", "hidden", "heads", "blocks", "ffn", "micro-batch",
                 "global-batch", "steps", "threads"):
        parser.add_argument("--" + name, type=int, required=True)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eps", type=float, default=1e-5)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    model = GPT(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.0)
    microbatches = args.global_batch // args.micro_batch
    generator = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        batches = [torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1),
                                 generator=generator) for _ in range(microbatches)]
        start = time.perf_counter()
        for batch in batches:
            loss = model(batch[:, :-1], batch[:, 1:]) / microbatches
            loss.backward()
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
