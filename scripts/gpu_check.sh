#!/usr/bin/env bash
# The GPU check, phase by phase: vLLM's CUDA build carried to an offline GPU machine in parts, the
# go/no-go check, the plugin's engine truth on tiny models built there, and the GPU's knee.
#
#   here (the package registries reachable):
#     bash scripts/gpu_check.sh bundle           # .offline/: parts of <= 58 MiB, manifest, model shapes
#   on the GPU machine, each call carrying what it names (the device tool's `carry`), back to back:
#     bash scripts/gpu_check.sh probe            # versions, pip list, nvidia-smi -> $OUT (carry nothing)
#     bash scripts/gpu_check.sh stash            # keep this call's parts in $STASH (carry .offline/part-NNN)
#     bash scripts/gpu_check.sh install          # check the parts, go/no-go, install into $SITE
#     bash scripts/gpu_check.sh truth            # the engine tests: JUnit XML and engine logs -> $OUT
#     bash scripts/gpu_check.sh knee             # random weights of the packaged pair's shapes: bench
#
# Every phase on the GPU machine writes what it saw under $OUT (default ./out/gpu). The bundle holds
# vLLM 0.32.0's CUDA wheel without the kernels an H200 serving small models does not load, and the
# distributions the machine lacks (scripts/gpu_device_packages.txt: the lent machine's packages).
# Method, plan and what ran: docs/gpu.md, "Carrying vLLM to an offline GPU".
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
OUT=${OUT:-out/gpu}
STASH=${STASH:-/tmp/spec-explorer-offline}
SITE=${SITE:-/tmp/spec-explorer-site}
BUNDLE=.offline
mkdir -p "$OUT"

# The engine tests that matter most where CUDA differs (docs/gpu.md's table), in this order:
# exact draft ids and counts equal to vLLM's metrics, greedy output equal to speculation off,
# a K table switched under load and the auction, the idle drafter's K=0 and its catch-up.
TRUTH_TESTS=(
  "tests/engine/test_engine_tiny.py::test_concurrent_requests_keep_exact_provenance"
  "tests/engine/test_engine_tiny.py::test_prometheus_deltas_match_the_request"
  "tests/engine/test_engine_tiny.py::test_greedy_speculative_text_equals_plain_text"
  "tests/engine/test_engine_tiny.py::test_draft_acceptance_by_draft_quality"
  "tests/engine/test_ledger_live.py::test_the_ledger_holds_every_request_vllm_runs_and_yours_as_it_streamed"
  "tests/engine/test_live_policy.py::test_a_live_switch_under_load_changes_k_within_two_steps"
  "tests/engine/test_live_policy.py::test_output_stays_lossless_while_k_changes"
  "tests/engine/test_live_policy.py::test_the_auction_trims_drafts_before_verification"
  "tests/engine/test_live_policy.py::test_the_auction_is_lossless"
  "tests/engine/test_live_policy.py::test_an_idle_drafter_skips_k0_steps_and_catches_up_after"
)

# Optional kernels an H200 running Qwen2.5 1.5B/0.5B does not load (vLLM falls back or never calls them)
DROPS=(
  "vllm-*:vllm/vllm_flash_attn/_vllm_fa2_C*"
  "vllm-*:vllm/third_party/flashmla/*"
  "vllm-*:vllm/_flashmla_C*"
  "vllm-*:vllm/_flashmla_extension_C*"
  "vllm-*:vllm/third_party/deep_gemm/*"
)

# CUDA-only distributions vLLM's plan names that it runs without (the machine's torch and triton
# stay; kernels vLLM falls back from): left out of the bundle, about 600 MiB
CUDA_EXTRAS='^(torch|triton|nvidia-|flashinfer|cuda-|tilelang|quack-kernels|tokenspeed-|humming-kernels|nccl|apache-tvm-ffi|pynvvideocodec|z3-solver|torchcodec)'

phase_bundle() {
  local want=(vllm==0.32.0 msgspec pyzmq pytest-asyncio gradio-client)
  "$PY" scripts/offline_bundle.py plan --have scripts/gpu_device_packages.txt "${want[@]}" \
    | grep -v -i -E "$CUDA_EXTRAS" >"$BUNDLE.missing.txt"
  local drop_args=()
  for d in "${DROPS[@]}"; do drop_args+=(--drop "$d"); done
  "$PY" scripts/offline_bundle.py build --out "$BUNDLE" --have scripts/gpu_device_packages.txt \
    --download $(cat "$BUNDLE.missing.txt") "${drop_args[@]}" --part-mib 58
  mkdir -p "$BUNDLE/shapes"
  for size in 1.5b 0.5b; do  # config and tokenizer of the packaged pair (no weights): the knee's shapes
    local src=~/.cache/spec-explorer/qwen2.5-coder-$size-instruct-bf16
    mkdir -p "$BUNDLE/shapes/$size" && cp "$src"/{config.json,tokenizer.json,tokenizer_config.json} "$BUNDLE/shapes/$size/"
  done
  ls -l "$BUNDLE"
}

phase_probe() {
  { nvidia-smi; "$PY" -V; "$PY" -c "import torch; print(torch.__version__, torch.cuda.is_available())"; } \
    >"$OUT/probe.txt" 2>&1 || true
  "$PY" -m pip list --format=freeze >"$OUT/pip-list.txt"
}

phase_stash() {
  mkdir -p "$STASH"
  cp -v "$BUNDLE"/manifest.json "$BUNDLE"/part-* "$STASH"/ 2>/dev/null || true
  [ -d "$BUNDLE/shapes" ] && cp -r "$BUNDLE/shapes" "$STASH"/
  ls -l "$STASH" | tee "$OUT/stash.txt"
}

phase_install() {
  set -o pipefail
  "$PY" scripts/offline_bundle.py install --bundle "$STASH" --target "$SITE" 2>&1 | tee "$OUT/install.txt"
}

phase_truth() {
  export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
  local status=0
  "$PY" -m pytest -x -p no:cacheprovider --timeout 900 --junitxml "$OUT/truth.xml" "${TRUTH_TESTS[@]}" \
    >"$OUT/truth.txt" 2>&1 || status=$?
  tail -n 40 "$OUT/truth.txt"
  mkdir -p "$OUT/engine-logs"  # an engine that failed keeps its log (EngineProcess.keep_log)
  find /tmp -maxdepth 2 -path '/tmp/spec-explorer-*' -name '*.log' -exec cp --backup=numbered {} "$OUT/engine-logs/" \;
  return $status
}

phase_knee() {
  export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
  for size in 1.5b 0.5b; do  # random weights: real step times, no real acceptance
    "$PY" - "$STASH/shapes/$size" "$STASH/random-$size" <<'EOF'
import shutil, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = sys.argv[1:]
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), torch_dtype=torch.bfloat16)
model.save_pretrained(dst)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{src}/{f}", dst)
EOF
  done
  "$PY" -m engine_adapter.bench --methods off,draft --concurrency 1,4,16,64,256 --k 3 --max-tokens 64 \
    --modes compiled --target "$STASH/random-1.5b" --draft "$STASH/random-0.5b" 2>&1 | tee "$OUT/knee.txt"
}

case "${1:-}" in
  bundle | probe | stash | install | truth | knee) "phase_$1" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
