# lit configuration for parc: every .par file under test/lit is a test; its RUN lines pipe
# parc into FileCheck.
import os
import lit.formats

config.name = "parc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".par", ".test"]
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.parc_obj_root, "test", "lit")

# A sanitizer build's settings (scripts/sanitize.sh) reach the tools under test.
for name in ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PARC_TEST_TIME_SCALE",
             "OMPI_MCA_mca_base_component_disable_dlclose", "OMPI_MCA_mca_base_env_list"):
    if name in os.environ:
        config.environment[name] = os.environ[name]

# Tools under test first, then FileCheck and `not` from LLVM.
config.environment["PATH"] = os.pathsep.join(
    [config.parc_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])
config.substitutions.append(("%examples", os.path.join(config.parc_src_root, "examples")))
# `%exit-status CMD`: CMD's output and error, then `exit N` (Inputs/exit-status.py).
config.substitutions.append(
    ("%exit-status", "python3 " + os.path.join(config.test_source_root, "Inputs", "exit-status.py")))
config.substitutions.append(("%spec", os.path.join(config.parc_src_root, "..", "shared", "spec", "examples")))

# GPU-dependent runtime tests: `cuda-backend` when parrun was built with the CUDA kernels (nvcc
# found), `cuda-device` when `nvidia-smi -L` lists a GPU. parrun --backend=cuda fails
# differently in each case, and each test names the case it expects.
import shutil
import subprocess


def lists_a_gpu():
    if not shutil.which("nvidia-smi"):
        return False
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and "GPU" in listing.stdout


if lists_a_gpu():
    config.available_features.add("cuda-device")
if getattr(config, "parc_cuda_backend", "OFF") == "ON":
    config.available_features.add("cuda-backend")

# `x86-avx2`: the CPU has AVX2, so OpenBLAS has kernels for it better than its SSE3 fallback.
def cpu_flags():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


if "avx2" in cpu_flags():
    config.available_features.add("x86-avx2")
