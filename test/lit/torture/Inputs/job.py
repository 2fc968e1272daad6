#!/usr/bin/env python3
"""job.py OUT.par [BLOCK.FIELD=EXPR ...] [blocks=EXPR] [more=EXPR] [-BLOCK.FIELD]: writes a
small valid job (a 4-block GPT on one 8-GPU node) with the given fields set to the given .par
expressions, or removed with -BLOCK.FIELD, so that each limit test changes only what it tests.
`blocks` is the count of its transformer layer; `more` adds a second transformer layer."""
import sys

FIELDS = {
    "model": {"dtype": "fp32", "vocab": "256", "seq": "64", "hidden": "128", "heads": "4",
              "ffn": "512"},
    "cluster": {"nodes": "1", "gpus_per_node": "8"},
    "parallel": {"tp": "2", "pp": "2", "dp": "auto", "micro_batch": "2", "global_batch": "16"},
}
blocks, more = "4", None
out = sys.argv[1]
for arg in sys.argv[2:]:
    if arg.startswith("-"):
        block, field = arg[1:].split(".", 1)
        del FIELDS[block][field]
        continue
    key, value = arg.split("=", 1)
    if key in ("blocks", "more"):
        blocks, more = (value, more) if key == "blocks" else (blocks, value)
        continue
    block, field = key.split(".", 1)
    FIELDS[block][field] = value


def body(block):
    return "\n".join(f"  {k} = {v}" for k, v in FIELDS[block].items())


extra = f"\n  layer more  : transformer x {more}" if more else ""
with open(out, "w") as f:
    f.write(f"""model m {{
{body("model")}
  layer embed : embedding
  layer block : transformer x {blocks}{extra}
  layer head  : lm_head tied(embed)
}}

cluster c {{
{body("cluster")}
  gpu {{ memory = 1024 PiB; flops = 50 GFLOPS }}
  intra_node {{ bandwidth = 10 GB/s; latency = 2 us }}
  inter_node {{ bandwidth = 10 GB/s; latency = 2 us }}
}}

parallel for m on c {{
{body("parallel")}
}}
""")
