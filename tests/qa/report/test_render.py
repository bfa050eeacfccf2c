"""qa.report.render end to end: verdict first, escaping of model and dataset text, GPQA by id only, a
self-contained HTML page, the KV section from a real kv_inspect.json, and a re-gate that shows only the
new policy's verdict and warnings."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from qa.api import gate
from qa.files.policy import default_policy, parse_policy
from qa.report import render
from quant.formats.catalog import kv_bytes_per_token
from quant.kv.inspect import InspectReport
from tests.qa.gate_fixtures import (
    GPQA_SECRET,
    HOSTILE_ANSWER,
    HOSTILE_COMPLETION,
    SECRET_KEY_VALUE,
    make_run_dir,
)
from tests.qa.report.conftest import write_kv

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parsed(page: str) -> _Collector:
    parser = _Collector()
    parser.feed(page)
    return parser


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, inspect_report: InspectReport) -> tuple[Path, str, str]:
    run = make_run_dir(tmp_path_factory.mktemp("r") / "run", kv=False)
    write_kv(run, inspect_report)
    gate(run, default_policy())
    paths = render(run)
    return run, paths.html.read_text(encoding="utf-8"), paths.markdown.read_text(encoding="utf-8")


def test_html_has_no_script_and_escapes_model_output(rendered: tuple[Path, str, str]) -> None:
    _, page, _ = rendered
    parser = _parsed(page)
    assert "script" not in [t for t, _ in parser.tags]
    assert "<script" not in page.lower()
    text = "".join(parser.text)  # the hostile completion and answer are shown, as text
    assert HOSTILE_COMPLETION in text
    assert HOSTILE_ANSWER in text
    assert all(not any(k.startswith("on") for k in attrs) for _, attrs in parser.tags)
    assert "content=\"default-src 'none'" in page  # CSP: no script could run anyway
    assert "model = &quot;&lt;script&gt;m&lt;/script&gt;&quot;" in page  # spec.toml shown, escaped


def test_html_is_self_contained_with_forest_and_kv_plots(rendered: tuple[Path, str, str]) -> None:
    _, page, _ = rendered
    parser = _parsed(page)
    imgs = [a for t, a in parser.tags if t == "img"]
    assert any("forest" in (a.get("alt") or "") for a in imgs)
    assert any("SQNR" in (a.get("alt") or "") for a in imgs)  # kv_inspect.json present
    for a in imgs:
        src = a.get("src") or ""
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    assert not [a for t, a in parser.tags if t == "link" or (t == "a" and a.get("href"))]


def test_verdict_comes_first_and_big(rendered: tuple[Path, str, str]) -> None:
    _, page, md = rendered
    body = page.split("<body>", 1)[1]
    assert body.startswith('<header class="banner fail" id="verdict"><h1>FAIL</h1>')
    assert body.index("<h1>FAIL</h1>") < body.index("Results")
    assert md.startswith("# ❌ FAIL\n")


def test_one_row_per_task_with_sigma_column(rendered: tuple[Path, str, str]) -> None:
    _, page, md = rendered
    results = page.split("<h2>Results</h2>", 1)[1].split("</table>", 1)[0]
    assert results.count("<tr>") == 1 + 4  # header + one row per task
    assert "1.5-SE rule" in results and "false alarm" in results
    assert "mid-p" in results and "need n ≥" in results
    md_rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "acc,none" in ln]
    assert len(md_rows) == 3


def test_gpqa_by_record_id_only_and_secrets_redacted(rendered: tuple[Path, str, str]) -> None:
    run, page, md = rendered
    for text in (page, md):
        assert GPQA_SECRET not in text
        assert SECRET_KEY_VALUE not in text
    assert "rec00000#0 (regression)" in page and "rec00000#0 (regression)" in md
    assert "[redacted]" in page
    assert GPQA_SECRET in (run / "records" / "baseline" / "gpqa_diamond_zeroshot.jsonl").read_text()  # it was there


def test_floor_task_points_to_agreement_and_kl(rendered: tuple[Path, str, str]) -> None:
    _, page, md = rendered
    assert "Accuracy carries no information here." in page
    callout = page.split('<div class="callout">', 1)[1].split("</div>", 1)[0]
    assert "gsm8k" in callout
    assert "201/250 = 80.4%" in callout  # identical extracted answers, with Wilson interval
    assert "KL divergence (wikitext): 0.012 nats/token" in callout
    assert "Accuracy carries no information here." in md


def test_markdown_escapes_and_links_its_figures(rendered: tuple[Path, str, str]) -> None:
    run, _, md = rendered
    assert "<script" not in md and "<img" not in md
    assert "![Forest plot of delta](plots/forest.png)" in md
    assert "![Per-layer KV-cache error](plots/kv.png)" in md
    for name in ("forest", "flips", "kv"):
        assert (run / "plots" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC


def test_kv_section_shows_the_inspect_report_in_both_files(
    rendered: tuple[Path, str, str], inspect_report: InspectReport
) -> None:
    _, page, md = rendered
    k0 = inspect_report.layers[0].k.sqnr_db
    attn0 = inspect_report.layers[0].attn_rel_error
    for text in (page, md):
        assert "Per-layer KV-cache error" in text
        assert "tiny-llama: nvfp4 KV cache, scales dynamic; 2 prompts x 24 tokens" in text
        assert f"{k0:.1f} / {k0:.1f}" in text  # one NVFP4 layer: its mean and min SQNR
        assert "exact / exact" in text  # the skipped layer reconstructs exactly (inf dB)
        assert f"{attn0:.3g} / {attn0:.3g}" in text
    kv_table = page.split("<h2>Per-layer KV-cache error</h2>", 1)[1].split("</table>", 1)[0]
    assert kv_table.count("<tr>") == 1 + 2  # header + the nvfp4 and the none (skipped) layers
    # the cache's memory, by the formats' definitions on the model's own geometry
    r = inspect_report
    assert r.kv_heads is not None and r.k_head_dim is not None
    size = {f: kv_bytes_per_token(f, r.k_head_dim, r.kv_heads, head_dim_v=r.v_head_dim) for f in ("nvfp4", "none")}
    assert r.bytes_per_token() == (size["nvfp4"] + size["none"], 2 * size["none"])
    for text in (page.replace("&#x27;", "'"), md):
        assert (f"KV-cache memory: {size['nvfp4'] + size['none']} bytes per token over 2 layers, "
                f"{100 * (size['nvfp4'] + size['none']) / (2 * size['none']):.1f}% of the 16-bit cache's "
                f"{2 * size['none']}") in text and "1 of 2 layers kept unquantized" in text


def test_a_kv_inspect_json_of_another_shape_is_named_not_shown(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=True)  # the legacy flat {"layers": [{"k_sqnr_db": ...}]}
    paths = render(run)
    page, md = paths.html.read_text(), paths.markdown.read_text()
    for text in (page, md):
        assert "kv_inspect.json could not be shown" in text and "not a kv-inspect report" in text
    assert "SQNR of K and V" not in page and not (run / "plots" / "kv.png").exists()


def test_report_without_records_or_kv(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    for p in sorted((run / "records").rglob("*.jsonl")):
        p.unlink()
    page = render(run).html.read_text()
    assert "SQNR" not in page and "KV-cache" not in page
    assert "none recorded" in page


def test_a_regate_shows_only_the_new_policys_verdict_and_warnings(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    gate(run, default_policy())
    strict = render(run, out_dir=tmp_path / "default").markdown.read_text()
    assert "the 1.5-SE rule would fail this task" not in strict
    # k = 0.1: the k-SE rule fails arc_challenge while non-inferiority passes -> a warning, this policy's only
    loose = parse_policy('name = "tight-k"\n[default]\nmargin = 0.08\nsigma_k = 0.1')
    md = render(run, loose, tmp_path / "loose").markdown.read_text()
    assert "policy tight-k" in md and "evaluated for this report under policy 'tight-k'" in md
    assert "the 0.1-SE rule would fail this task" in md
    assert "margin 2.0 pts" not in md and "margin 8.0 pts" in md
    assert "policy default" not in md


def test_report_cli(tmp_path: Path) -> None:
    from qa.cli import main

    run = make_run_dir(tmp_path / "run", kv=False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["report", str(run), "--out", str(out)])
    assert info.value.code == 0
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert re.search(r"<h1>(PASS|FAIL|INCONCLUSIVE)</h1>", (out / "report.html").read_text())
    assert json.loads((run / "comparison.json").read_text())["schema_version"] == 2  # the report writes nothing there
    assert not (run / "report.html").exists()
