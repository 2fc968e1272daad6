"""megatron_check.py PARC JOB.par LAUNCH.sh: Megatron-LM's own parse_args, validate_args and
TransformerConfig (from the checkout on PYTHONPATH) read the arguments of LAUNCH.sh, which parc
--emit=megatron wrote for JOB, with its environment and the job's world size, as one rank of an
H100 cluster would; the sizes Megatron derives must be the job's."""
import contextlib
import io
import os
import re
import subprocess
import sys
import typing
import warnings

from job_facts import job_facts, verdict

if not hasattr(typing, "override"):  # Megatron's main imports typing.override (Python 3.12)
    typing.override = lambda f: f
warnings.filterwarnings("ignore")

parc, par, script = sys.argv[1:4]
job = job_facts(parc, par)
text = open(script).read()
placeholders = dict(os.environ, MEGATRON_LM="/megatron", DATA_PATH="/data/prefix",
                    TOKENIZER_MODEL="tokenizer", MASTER_ADDR="node0", NODE_RANK="0")
args = subprocess.run(["bash", script, "--print-args"], env=placeholders, capture_output=True,
                      text=True, check=True).stdout.splitlines()
for line in text.splitlines():  # the environment the script sets
    if m := re.match(r"export (\w+)=(\S+)$", line):
        os.environ[m.group(1)] = m.group(2)
    elif m := re.match(r"unset (\w+)$", line):
        os.environ.pop(m.group(1), None)
nodes = int(re.search(r"--nnodes (\d+)", text).group(1))
gpus = int(re.search(r"--nproc-per-node (\d+)", text).group(1))
os.environ.update(WORLD_SIZE=str(nodes * gpus), RANK="0")
sys.argv = ["pretrain_gpt.py"] + args

import megatron.training.arguments as arguments  # noqa: E402
import megatron.core.transformer.transformer_config as transformer_config  # noqa: E402
import megatron.core.models.common.embeddings.rope_utils as rope_utils  # noqa: E402

# An H100 (the CUDA_DEVICE_MAX_CONNECTIONS rule applies) with Transformer Engine and its fused
# kernels, which this CPU venv lacks.
arguments.get_device_arch_version = lambda: 9
transformer_config.is_te_min_version = lambda *a, **k: True
rope_utils.fused_apply_rotary_pos_emb = rope_utils.fused_apply_rotary_pos_emb or (lambda *a: 0)
with contextlib.redirect_stdout(io.StringIO()):
    parsed = arguments.parse_args()
    arguments.validate_args(parsed)
    config = arguments.core_transformer_config_from_args(parsed)
derived = {"tp": parsed.tensor_model_parallel_size, "pp": parsed.pipeline_model_parallel_size,
           "dp": parsed.data_parallel_size}
problems = [f"{k}: Megatron {v}, parc {job[k]}" for k, v in derived.items() if v != job[k]]
verdict("megatron", script.split("/")[-1], problems,
        f"validate_args and TransformerConfig accept it; world {parsed.world_size} = tp "
        f"{derived['tp']} x pp {derived['pp']} x dp {derived['dp']}, virtual stages "
        f"{parsed.virtual_pipeline_model_parallel_size or 1}, {config.num_layers} layers, "
        f"{config.num_attention_heads} heads / {config.num_query_groups} groups of "
        f"{config.kv_channels}, ffn {config.ffn_hidden_size}, vocab {parsed.padded_vocab_size}")
