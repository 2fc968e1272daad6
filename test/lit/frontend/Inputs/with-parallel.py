"""Writes a complete .par file to argv[1] whose parallel block holds the lines argv[2:],
starting on line 2, followed by a small model and cluster."""
import sys

out, lines = sys.argv[1], sys.argv[2:]
body = "".join(f"  {line}\n" for line in lines)
with open(out, "w") as f:
    f.write(f"""parallel for m on c {{
{body}  global_batch = 8
}}
model m {{
  dtype = bf16; vocab = 512; seq = 64; hidden = 128; heads = 4; ffn = 512
  layer e : embedding; layer b : transformer x 4; layer h : lm_head
}}
cluster c {{
  nodes = 1; gpus_per_node = 8
  gpu {{ memory = 16 GiB; flops = 100 TFLOPS }}
  intra_node {{ bandwidth = 100 GB/s; latency = 1 us }}
}}
""")
