"""Run specs: validation, one-line errors, run-directory protection, and parser fuzzing."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qa.errors import SpecError
from qa.files.rundir import RunDir, prepare_run_dir
from qa.files.spec import dump_spec, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

MINIMAL = """
name = "t"
[arms.baseline]
engine = "hf"
[arms.candidate]
engine = "hf"
engine_args = { kv = { format = "nvfp4" } }
[[tasks]]
name = "arc_easy"
limit = 10
"""


def test_minimal_spec_fills_defaults():
    spec = parse_spec(MINIMAL)
    assert spec.model == "smollm2-135m" and spec.seed == 1234 and spec.policy == "default"
    assert spec.tasks[0].repeats == 1 and spec.arms["candidate"].engine_args.kv.format == "nvfp4"


def test_dump_round_trips():
    spec = parse_spec(MINIMAL)
    assert parse_spec(dump_spec(spec)) == spec


SPECS = sorted(p for p in EXAMPLES.glob("**/*.toml") if "policies" not in p.relative_to(EXAMPLES).parts)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_shipped_example_is_valid(path):
    load_spec(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MINIMAL + "\nsurprise = 1\n", "surprise: unknown key"),
        (MINIMAL.replace('limit = 10', 'limt = 10'), "tasks.0.limt: unknown key"),
        (MINIMAL.replace('limit = 10', 'limit = 0'), "tasks.0.limit"),
        (MINIMAL.replace('[arms.candidate]\nengine = "hf"\n', ""), "no candidate arm"),
        (MINIMAL.replace('[arms.baseline]', '[arms.base]'), "missing arm baseline"),
        (MINIMAL.replace('[arms.candidate]', '[arms."nv fp4"]'), "arm name 'nv fp4'"),
        (MINIMAL.replace('[arms.candidate]', '[arms.kv-inspect]'), "arm name 'kv-inspect'"),
        (MINIMAL.replace('[arms.candidate]\n', '[arms.candidate]\nfrom = "runs/old"\n'),
         "arms.candidate.from: only the baseline"),
        (MINIMAL.replace('engine = "hf"', 'engine = "hff"', 1), "arms.baseline.engine"),
        (MINIMAL.replace('name = "t"', 'name = "a b/c"'), "name"),
        ("name = ", "not valid TOML"),
        (MINIMAL + '\n[[tasks]]\nname = "arc_easy"\n', "listed twice"),
    ],
)
def test_bad_specs_are_one_line_errors(text, message):
    with pytest.raises(SpecError) as info:
        parse_spec(text, "s.toml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "nope.toml")


def test_run_dir_refuses_another_run_and_keeps_its_files(tmp_path):
    run = tmp_path / "run"
    spec = parse_spec(MINIMAL)
    prepare_run_dir(spec, run)
    (run / "comparison.json").write_text("{finished}")
    prepare_run_dir(spec, run)  # same spec: resume
    other = parse_spec(MINIMAL.replace("limit = 10", "limit = 11"))
    with pytest.raises(SpecError, match="holds another run .*tasks"):
        prepare_run_dir(other, run)
    assert (run / "comparison.json").read_text() == "{finished}"
    assert RunDir(run).load_spec() == spec


def test_run_dir_refuses_a_foreign_nonempty_folder(tmp_path):
    (tmp_path / "x.txt").write_text("mine")
    with pytest.raises(SpecError, match="not empty"):
        prepare_run_dir(parse_spec(MINIMAL), tmp_path)
    assert (tmp_path / "x.txt").read_text() == "mine"


_keys = st.sampled_from(["name", "model", "seed", "arms", "tasks", "policy", "engine", "limit", "x", "calibration"])
_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6), st.floats(allow_nan=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=6))
def test_parser_never_crashes_on_structured_input(data):
    import tomli_w

    try:
        text = tomli_w.dumps({k: v for k, v in data.items() if v is not None})
    except (TypeError, ValueError):
        return
    try:
        parse_spec(text)
    except SpecError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_crashes_on_text(text):
    try:
        parse_spec(text)
    except SpecError:
        pass


def test_engine_args_are_parsed_once_by_the_engines_model() -> None:
    from evals.engines.hf.args import HFEngineArgs
    from evals.engines.openai_api.args import OpenAIArgs
    from quant.kv.spec import KVQuantSpec

    spec = parse_spec(MINIMAL)
    cand = spec.arms["candidate"]
    assert isinstance(cand.engine_args, HFEngineArgs) and isinstance(cand.engine_args.kv, KVQuantSpec)
    assert cand.given_args() == {"kv": {"format": "nvfp4"}}  # what spec.toml keeps, not every default
    assert parse_spec(dump_spec(spec)) == spec
    served = parse_spec('name = "s"\n[arms.baseline]\nengine = "openai"\nengine_args = { concurrency = 2 }\n'
                        '[arms.candidate]\nengine = "openai"\n[[tasks]]\nname = "arc_easy"\n')
    assert isinstance(served.arms["baseline"].engine_args, OpenAIArgs)
    with pytest.raises(SpecError, match=r"arms.candidate: hf engine: unknown argument 'batch_sise'; did you mean 'batch_size'\?"):
        parse_spec('name = "s"\n[arms.baseline]\n[arms.candidate]\nengine_args = { batch_sise = 4 }\n'
                   '[[tasks]]\nname = "arc_easy"\n')


def test_candidates_are_every_arm_but_baseline_and_rerun_in_spec_order():
    legacy = parse_spec(MINIMAL)
    assert legacy.candidates == ["candidate"] and not legacy.per_candidate_dirs
    text = MINIMAL.replace("[arms.candidate]", "[arms.rerun]\nengine = \"hf\"\n[arms.nvfp4_kv]") + \
        '\n[arms.replay]\nengine = "hf"\n'
    several = parse_spec(text)
    assert several.candidates == ["nvfp4_kv", "replay"] and several.per_candidate_dirs
    assert parse_spec(dump_spec(several)).candidates == ["nvfp4_kv", "replay"]  # spec.toml keeps the order
    one_renamed = parse_spec(MINIMAL.replace("[arms.candidate]", "[arms.nvfp4_kv]"))
    assert one_renamed.per_candidate_dirs  # only an arm named "candidate" keeps the root layout
    reused = parse_spec(MINIMAL.replace("[arms.baseline]\n", '[arms.baseline]\nfrom = "runs/old"\n'))
    assert reused.arms["baseline"].from_run == "runs/old"
    assert parse_spec(dump_spec(reused)).arms["baseline"].from_run == "runs/old"
