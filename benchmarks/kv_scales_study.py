"""SmolLM2-135M NVFP4 KV study: per-layer SQNR (kv-inspect) and wikitext2 perplexity for 4 scale choices.

Usage: python benchmarks/kv_scales_study.py N_CAL_SAMPLES N_PPL_WINDOWS [OUT_DIR]
"""
import json, math, sys, time
from pathlib import Path
import torch
torch.set_num_threads(2)
from evals import data
from evals.models import load_model, resolve_model
from qa.commands.calibrate import load_prompts
from quant.calibrate import CalibrationSpec, calibrate
from quant.inspect import inspect_kv, plot_report
from quant.kv_cache import make_cache
from quant.kv_spec import KVQuantSpec
from quant.scales import KVScales

OUT = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("reports/runs/kv_study")  # argv: N_CAL N_PPL [OUT]
OUT.mkdir(parents=True, exist_ok=True)
N_CAL, CAL_LEN = int(sys.argv[1]), 512
N_PPL = int(sys.argv[2])
model, tok = load_model(resolve_model("smollm2-135m"))
scales = {}
for obs in ("absmax", "mse"):
    p = OUT / f"scales_{obs}"
    if not (OUT / f"scales_{obs}.json").exists():
        t = time.time()
        name, chunks = load_prompts(tok, "gsm8k", Path("/work/shared/data"), N_CAL, CAL_LEN, 0)
        s = calibrate(model, chunks, CalibrationSpec(observer=obs, n_samples=N_CAL, seq_len=CAL_LEN, mse_max_tokens=2048), data_name=name, model_name="smollm2-135m")
        s.save(p); print(obs, "calibrated in", round(time.time() - t), "s", flush=True)
    scales[obs] = KVScales.load(p)
configs = {
    "dynamic": (KVQuantSpec(format="nvfp4"), None),
    "absmax": (KVQuantSpec(format="nvfp4", scales="static"), scales["absmax"]),
    "mse": (KVQuantSpec(format="nvfp4", scales="static"), scales["mse"]),
    "scale_1.0": (KVQuantSpec(format="nvfp4", scales="constant", constant_scale=1.0), None),
}
_, prompts = load_prompts(tok, "wikitext2", Path("/work/shared/data"), 4, 256, 0)
rows = data.load("wikitext2", Path("/work/shared/data"))
ids = torch.tensor(tok("\n\n".join(r["text"] for r in rows), add_special_tokens=False)["input_ids"])
windows = ids[: (ids.numel() // 512) * 512].reshape(-1, 512)[:N_PPL]

def ppl(spec, sc):
    nll, n = 0.0, 0
    with torch.no_grad():
        for w in windows:
            w = w[None]
            if spec is None:
                logits = model(input_ids=w).logits
            else:
                logits = model(input_ids=w, cache=make_cache(model.config, spec, sc), use_cache=True).logits
            lp = torch.log_softmax(logits[0, :-1].double(), -1)
            nll -= float(lp.gather(-1, w[0, 1:, None]).sum()); n += w.shape[1] - 1
    return math.exp(nll / n)

results = {"n_cal": N_CAL, "n_ppl_windows": int(windows.shape[0]), "plain_ppl": ppl(None, None)}
print("plain ppl", results["plain_ppl"], flush=True)
for name, (spec, sc) in configs.items():
    rep = inspect_kv(model, prompts, spec, sc, model_name="smollm2-135m")
    (OUT / f"inspect_{name}.json").write_text(rep.model_dump_json(indent=1))
    plot_report(rep, OUT / f"inspect_{name}.png")
    p = ppl(spec, sc)
    results[name] = {"ppl": p, "dppl": p - results["plain_ppl"],
                     "k_sqnr": [round(l.k.sqnr_db, 2) for l in rep.layers], "v_sqnr": [round(l.v.sqnr_db, 2) for l in rep.layers],
                     "k_underflow": [round(l.k.underflow_share, 4) for l in rep.layers],
                     "v_underflow": [round(l.v.underflow_share, 4) for l in rep.layers],
                     "attn": [round(l.attn_rel_error, 4) for l in rep.layers]}
    print(name, "ppl", p, "mean K/V SQNR", sum(results[name]["k_sqnr"]) / 30, sum(results[name]["v_sqnr"]) / 30, flush=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
