"""The `load` option of an `openai` arm: parsed with one-line errors (what a served arm cannot take refused with
its reason), filler prompts and bodies, and the record's place in arm.json beside the offline one."""

from __future__ import annotations

import random

import pytest

from evals.engines import parse_engine_args
from evals.engines.load import LoadRecord
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.openai_api.load import ServedLoadRecord, filler_body, filler_path, filler_prompts
from evals.errors import EngineError
from evals.records.arm_file import EngineSummary

URL = "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(("args", "message"), [
    ({"load": {"concurency": 4}}, "load: unknown key 'concurency'; did you mean 'concurrency'?"),
    ({"load": {"concurrency": 0}}, "load.concurrency: Input should be greater than or equal to 1"),
    ({"load": {"concurrency": 2, "evaluated_slots": 3}}, "evaluated_slots = 3 exceeds concurrency = 2"),
    ({"load": {"concurrency": 2, "filler": "wiki"}}, "load.filler: Input should be 'task' or 'wikitext2'"),
    ({"load": {"concurrency": 4, "kv_cache_blocks": 8}},
     "load.kv_cache_blocks: an openai arm cannot size its server's KV cache; set num_gpu_blocks_override"),
    ({"load": {"concurrency": 300}}, "load.concurrency = 300: an openai arm holds one client thread"),
    ({"concurrency": 2, "load": {"concurrency": 4}}, "concurrency and load: under load, load.evaluated_slots"),
    ({"base_url": None, "base_urls": [URL, "http://127.0.0.1:10/v1"], "load": {"concurrency": 4}},
     "load drives one server; base_urls lists several replicas"),
])
def test_bad_load_is_one_line(args: dict, message: str) -> None:
    with pytest.raises(EngineError, match="^openai engine.*" + message.replace("?", r"\?").replace(".", r"\.")) as err:
        parse_engine_args("openai", {"base_url": URL, **args})
    assert "\n" not in str(err.value)


def test_load_parses_and_stays_as_given() -> None:
    args = parse_engine_args("openai", {"base_url": URL, "load": {"concurrency": 4, "evaluated_slots": 1}})
    assert isinstance(args, OpenAIArgs) and args.load is not None
    assert args.load.slots == 1 and args.load.filler == "task"
    assert args.model_dump(mode="json", exclude_unset=True)["load"] == {"concurrency": 4, "evaluated_slots": 1}


def test_task_fillers_are_the_calls_prompts_rotated() -> None:
    prompts = ["a", "bb", "ccc", "dddd"]
    assert filler_prompts(prompts, "task", random.Random(0)) == ["ccc", "dddd", "a", "bb"]


def test_wikitext_fillers_have_the_prompts_lengths() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    ids = list(range(500))
    chat = [{"role": "system", "content": "x" * 10}, {"role": "user", "content": "y" * 30}]
    got = filler_prompts(["p" * 17, [5] * 9, chat], "wikitext2", random.Random(1), wikitext_text=text,
                         wikitext_ids=ids)
    assert isinstance(got[0], str) and len(got[0]) == 17 and got[0] in text
    assert isinstance(got[1], list) and len(got[1]) == 9 and got[1] == list(range(got[1][0], got[1][0] + 9))
    assert isinstance(got[2], list) and got[2][0]["role"] == "user" and len(got[2][0]["content"]) == 40
    again = filler_prompts(["p" * 17, [5] * 9, chat], "wikitext2", random.Random(1), wikitext_text=text,
                           wikitext_ids=ids)
    assert again == got  # the seed fixes the windows


def test_filler_bodies_ignore_eos_where_the_server_honours_it() -> None:
    assert filler_body("hi", 8, "vllm") == {"prompt": "hi", "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    assert filler_body([1, 2], 8, "sglang")["prompt"] == [[1, 2]]  # one prompt of token ids
    assert "ignore_eos" not in filler_body("hi", 8, "openai")
    chat = [{"role": "user", "content": "hi"}]
    assert filler_path(chat) == "/chat/completions" and filler_body(chat, 4, "llamacpp")["messages"] == chat
    assert filler_path("hi") == filler_path([1]) == "/completions"


def _served() -> ServedLoadRecord:
    return ServedLoadRecord(
        concurrency=4, filler="task", filler_max_tokens=8, evaluated_slots=1, server="openai",
        filler_ignore_eos=False, evaluated_requests=3, filler_requests=9, companions_min=2.9, companions_mean=2.95,
        sample_interval_s=0.0, samples=0, running_samples=None, max_running=None, mean_running=None,
        max_waiting=None, preemptions=None, kv_cache_usage_max=None, kv_cache_usage_mean=None, kv_cache_blocks=None,
        block_size=None, unrecorded=["the server's own counters: not read"])


def test_arm_json_keeps_a_served_or_an_offline_record() -> None:
    served = EngineSummary(name="openai", deterministic=False, load=_served())
    back = EngineSummary.model_validate_json(served.model_dump_json())
    assert isinstance(back.load, ServedLoadRecord) and back == served
    offline = LoadRecord(concurrency=4, filler="task", filler_max_tokens=8, evaluated_slots=1, kv_cache_blocks=6,
                         block_size=128, evaluated_requests=4, filler_requests=12, steps=10, running_steps={"4": 10},
                         max_running=4, mean_running=4.0, max_waiting=0, preemptions=0, kv_cache_usage_max=0.5,
                         kv_cache_usage_mean=0.4, companions_min=3, companions_mean=3.0)
    back = EngineSummary.model_validate_json(EngineSummary(name="vllm", deterministic=True, load=offline)
                                             .model_dump_json())
    assert isinstance(back.load, LoadRecord) and back.load == offline
