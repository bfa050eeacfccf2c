"""Reports: verdict first, escaping of model and dataset text, GPQA by id only, self-contained HTML."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from qa import plots
from qa.gate import gate_run
from qa.policy import default_policy, parse_policy
from qa.report import gather, read_kv_inspect, render, resolve_verdict
from tests.qa.gate_fixtures import (
    GPQA_SECRET,
    HOSTILE_ANSWER,
    HOSTILE_COMPLETION,
    SECRET_KEY_VALUE,
    make_run_dir,
)

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


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    run = make_run_dir(tmp_path_factory.mktemp("r") / "run")
    gate_run(run, default_policy())
    paths = render(run)
    return run, paths.html.read_text(encoding="utf-8"), paths.markdown.read_text(encoding="utf-8")


def test_html_has_no_script_and_escapes_model_output(rendered: tuple[Path, str, str]) -> None:
    _, page, _ = rendered
    parser = _Collector()
    parser.feed(page)
    tags = [t for t, _ in parser.tags]
    assert "script" not in tags
    assert "<script" not in page.lower()
    # the hostile completion and answer are shown, as text
    text = "".join(parser.text)
    assert HOSTILE_COMPLETION in text
    assert HOSTILE_ANSWER in text
    assert all(not any(k.startswith("on") for k in attrs) for _, attrs in parser.tags)
    assert "content=\"default-src 'none'" in page  # CSP: no script could run anyway
    assert "model = &quot;&lt;script&gt;m&lt;/script&gt;&quot;" in page  # spec.toml shown, escaped


def test_html_is_self_contained_with_forest_plot(rendered: tuple[Path, str, str]) -> None:
    _, page, _ = rendered
    parser = _Collector()
    parser.feed(page)
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
    assert "rec00000#0 (regression)" in page
    assert "[redacted]" in page
    assert (
        GPQA_SECRET in (run / "records" / "baseline" / "gpqa_diamond_zeroshot.jsonl").read_text()
    )  # it was there


def test_floor_task_points_to_agreement_and_kl(rendered: tuple[Path, str, str]) -> None:
    _, page, md = rendered
    assert "Accuracy carries no information here." in page
    callout = page.split('<div class="callout">', 1)[1].split("</div>", 1)[0]
    assert "gsm8k" in callout
    assert "201/250 = 80.4%" in callout  # identical extracted answers, with Wilson interval
    assert "KL divergence (wikitext): 0.012 nats/token" in callout
    assert "Accuracy carries no information here." in md


def test_markdown_escapes(rendered: tuple[Path, str, str]) -> None:
    run, _, md = rendered
    assert "<script" not in md and "<img" not in md
    assert "![Forest plot of delta](plots/forest.png)" in md
    assert (run / "plots" / "forest.png").read_bytes()[:8] == PNG_MAGIC


def test_stale_verdict_is_regated(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    gate_run(run, parse_policy('name = "wide"\n[default]\nmargin = 0.08'))
    comp = gather(run).comparison
    v, source = resolve_verdict(run, comp, None)
    assert source == "verdict.json" and v.policy.name == "wide"
    (run / "comparison.json").write_text((run / "comparison.json").read_text() + "\n")  # other bytes
    v2, source2 = resolve_verdict(run, comp, None)
    assert source2.startswith("re-evaluated") and v2.policy.name == "wide"
    v3, source3 = resolve_verdict(run, comp, default_policy())
    assert v3.policy.name == "default" and "policy 'default'" in source3
    (run / "verdict.json").unlink()
    assert "shipped default" in resolve_verdict(run, comp, None)[1]


def test_report_without_records_or_kv(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    for p in sorted((run / "records").rglob("*.jsonl")):
        p.unlink()
    page = render(run).html.read_text()
    assert "SQNR" not in page
    assert "None recorded" in page


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ('{"layers": [{"layer": 0, "k_sqnr_db": 20.5, "v_sqnr_db": 19}]}', (["0"], [20.5], [19.0])),
        ('{"per_layer": [{"index": 3, "sqnr_k": 1, "sqnr_v": null}]}', (["3"], [1.0], [None])),
        ('{"k_sqnr_db": [1, 2], "v_sqnr_db": [3, 4]}', (["0", "1"], [1.0, 2.0], [3.0, 4.0])),
        ("[1, 2]", None),
        ("not json", None),
        ('{"layers": [{"layer": 0, "mse": 1}]}', None),
    ],
)
def test_read_kv_inspect_defensively(tmp_path: Path, content: str, expect: tuple | None) -> None:
    path = tmp_path / "kv_inspect.json"
    path.write_text(content)
    kv = read_kv_inspect(path)
    if expect is None:
        assert kv is None
    else:
        assert kv is not None and (kv.layers, kv.k_sqnr_db, kv.v_sqnr_db) == expect


def test_plots_are_png_and_labels_cannot_trigger_mathtext() -> None:
    rows = [plots.ForestRow("$\\alpha$ task", -0.01, (-0.02, 0.0), (-0.025, 0.005), 0.02, "pass")]
    assert plots.forest_plot(rows)[:8] == PNG_MAGIC
    assert plots.flips_plot([plots.FlipRow("a$b$", 3, 1)])[:8] == PNG_MAGIC
    assert plots.kl_plot("kl", [0.01, 0.02, 0.03], 0.02)[:8] == PNG_MAGIC
    assert plots.kv_error_plot(["0", "1"], [20.0, None], [18.0, 19.0])[:8] == PNG_MAGIC


def test_report_cli(tmp_path: Path) -> None:
    import qa.commands.gate  # noqa: F401
    from qa.cli import main

    run = make_run_dir(tmp_path / "run", kv=False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["report", str(run), "--out", str(out)])
    assert info.value.code == 0
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert re.search(r"<h1>(PASS|FAIL|INCONCLUSIVE)</h1>", (out / "report.html").read_text())
    assert json.loads((run / "comparison.json").read_text())["schema_version"] == 1
