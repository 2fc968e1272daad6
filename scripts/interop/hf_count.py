"""hf_count.py CONFIG PARC_COUNT: transformers builds the model of CONFIG on the meta device;
its parameter count (tied weights once) must be PARC_COUNT, the one parc --import-hf wrote."""
import json
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
path, parc_count = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    raw = json.load(f)
config = transformers.CONFIG_MAPPING[raw["model_type"]].from_dict(raw)
with torch.device("meta"):
    model = getattr(transformers, raw["architectures"][0])(config)
count = sum(p.numel() for p in model.parameters())
verdict = "ok" if count == parc_count else "MISMATCH"
print(f"{verdict:8} {path.split('/')[-1]:28} transformers {count:>15,}  parc {parc_count:>15,}")
sys.exit(count != parc_count)
