"""deepspeed_check.py PARC JOB.par CONFIG.json: DeepSpeed's own DeepSpeedConfig reads CONFIG,
which parc --emit=deepspeed wrote for JOB, with the job's data-parallel size; the batch, ZeRO
stage and precision must be the job's, and the learning rate, replayed through DeepSpeed's
WarmupLR on the configured optimizer, parc's: lr * min(1, (k + 1) / W) for update k."""
import json
import sys
import warnings

from job_facts import job_facts, verdict

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import deepspeed.runtime.config as dsc  # noqa: E402
from deepspeed.runtime.lr_schedules import WarmupLR  # noqa: E402

parc, par, path = sys.argv[1:4]
job = job_facts(parc, par)
dsc.dist.get_rank = lambda *a, **k: 0  # no process group here: the mpu gives the dp size


class DataParallel:
    def get_data_parallel_world_size(self):
        return job["dp"]

    def get_data_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return job["tp"] * job["pp"]

    def get_model_parallel_rank(self):
        return 0


with open(path) as f:
    raw = json.load(f)
config = dsc.DeepSpeedConfig(raw, mpu=DataParallel())
checks = {
    "data-parallel size": (config.world_size, job["dp"]),
    "batch = micro x accumulation x dp": (
        config.train_batch_size,
        config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * job["dp"]),
    "ZeRO stage": (config.zero_optimization_stage, job["zero"]),
    "bf16": (config.bfloat16_config.enabled, job["dtype"] == "bf16"),
    "fp16": (config.float16_config.enabled, job["dtype"] == "fp16"),
}
problems = [f"{what}: DeepSpeed {got}, parc {want}" for what, (got, want) in checks.items()
            if got != want]
param = torch.nn.Parameter(torch.zeros(1))
optimizer = (torch.optim.AdamW if raw["optimizer"]["type"] == "AdamW" else torch.optim.SGD)(
    [param], lr=raw["optimizer"]["params"]["lr"])
scheduler = WarmupLR(optimizer, **raw["scheduler"]["params"])
lr, warmup = job["lr"], job["warmup"]
for k in range(warmup + 3):
    want = lr * min(1.0, (k + 1) / warmup) if warmup > 0 else lr
    got = optimizer.param_groups[0]["lr"]
    if abs(got - want) > 1e-9 * want:
        problems.append(f"update {k}: DeepSpeed's learning rate {got}, parc's {want}")
    optimizer.step()
    scheduler.step()
verdict("deepspeed", path.split("/")[-1], problems,
        f"DeepSpeedConfig accepts it; train_batch_size {config.train_batch_size} = "
        f"{config.train_micro_batch_size_per_gpu} x {config.gradient_accumulation_steps} x dp "
        f"{config.world_size}, zero {config.zero_optimization_stage}, {job['dtype']}, WarmupLR "
        f"= parc's rate over {warmup + 3} updates")
