"""The reasoning split and the truncation rule on recorded strings: think tags in the output, the
opening tag written by the chat template, custom tags, a server's reasoning_content."""

from __future__ import annotations

import pytest

from evals.prompts.reasoning import (
    DEFAULT_THINK_TAGS,
    ThinkSplit,
    is_truncated,
    opens_reasoning,
    split_reasoning,
    think_tags,
)

TAGS = DEFAULT_THINK_TAGS
# Qwen3's chat template with enable_thinking = true ends the prompt with nothing; DeepSeek-R1's newer
# template (and Qwen3-Thinking's) ends it with "<think>\n"; enable_thinking = false closes an empty block.
R1_PROMPT = "<|User|>What is 2+2?<|Assistant|><think>\n"
NO_THINK_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.mark.parametrize(
    ("text", "prompt", "want"),
    [
        # a plain instruct model: no tags, all answer (vLLM's deepseek_r1 would call it all reasoning)
        ("The answer is 4.", "", ThinkSplit("The answer is 4.", None, True)),
        # tags in the output: vLLM's BaseThinkingReasoningParser.extract_reasoning split
        ("<think>2+2 is 4</think>The answer is 4.", "", ThinkSplit("The answer is 4.", "2+2 is 4", True)),
        ("<think>\nsum\n</think>\n\nThe answer is 4.", "", ThinkSplit("\n\nThe answer is 4.", "\nsum\n", True)),
        # the template opened the block: the output starts inside the reasoning
        ("2+2 is 4\n</think>\n\nThe answer is 4.", R1_PROMPT, ThinkSplit("\n\nThe answer is 4.", "2+2 is 4\n", True)),
        # no start tag anywhere but an end tag: still reasoning up to it (as deepseek_r1)
        ("2+2 is 4</think>4", "", ThinkSplit("4", "2+2 is 4", True)),
        # cut off inside the reasoning
        ("<think>let me think about", "", ThinkSplit("", "let me think about", False)),
        ("let me think about", R1_PROMPT, ThinkSplit("", "let me think about", False)),
        # a closed empty block in the prompt (enable_thinking = false): the output is answer
        ("The answer is 4.", NO_THINK_PROMPT, ThinkSplit("The answer is 4.", None, True)),
        # answer text before a reasoning block stays answer (vLLM's olmo3 parser keeps it as content)
        ("Sure. <think>hm</think> 4", "", ThinkSplit("Sure.  4", "hm", True)),
    ],
)
def test_split_at_default_tags(text: str, prompt: str, want: ThinkSplit) -> None:
    assert split_reasoning(text, TAGS, prompt=prompt) == want


def test_custom_tags_and_no_split() -> None:
    tags = ("<reasoning>", "</reasoning>")
    got = split_reasoning("<reasoning>r</reasoning>A: 3 <think>x</think>", tags)
    assert got == ThinkSplit("A: 3 <think>x</think>", "r", True)
    assert split_reasoning("<think>r</think>a", None) == ThinkSplit("<think>r</think>a", None, True)
    assert opens_reasoning("...<reasoning>\n", tags) and not opens_reasoning("...<reasoning>\n", None)


def test_server_reasoning_content() -> None:
    # vLLM with --reasoning-parser: message.reasoning_content holds the reasoning, content the answer
    assert split_reasoning(" 4", TAGS, server_reasoning="2+2") == ThinkSplit(" 4", "2+2", True)
    # truncated inside the reasoning: the server returns no content
    assert split_reasoning("", TAGS, server_reasoning="2+2 is") == ThinkSplit("", "2+2 is", False)
    # a parser that left tags in the content: split again, reasoning joined
    assert split_reasoning("<think>b</think>4", TAGS, server_reasoning="a") == ThinkSplit("4", "ab", True)
    assert split_reasoning("4", None, server_reasoning="a") == ThinkSplit("4", "a", True)


def test_truncated_needs_a_length_stop_and_a_missing_answer() -> None:
    closed, unclosed = ThinkSplit("The answer is 4", "r", True), ThinkSplit("", "r", False)
    assert not is_truncated("stop", unclosed, {"strict-match": "[invalid]"})
    assert is_truncated("length", unclosed, {"strict-match": "4"})
    assert not is_truncated("length", closed, {"strict-match": "4", "flexible-extract": "4"})
    # a chain of thought cut short: flexible-extract takes its last number, strict-match finds no answer
    assert is_truncated("length", closed, {"strict-match": "[invalid]", "flexible-extract": "12"})
    assert is_truncated("length", closed, {"strict-match": "[invalid]", "flexible-extract": None})
    assert is_truncated("length", closed, {"none": "[invalidanswer]"})  # minerva math's fallback
    assert is_truncated("length", closed, {})  # no filter to tell: a length stop counts


def test_think_tags_of_a_task() -> None:
    class Plain:
        pass

    class Tagged:
        think_tags = ("<r>", "</r>")

    class Off:
        think_tags = None

    assert think_tags(Plain()) == TAGS and think_tags(Tagged()) == ("<r>", "</r>") and think_tags(Off()) is None
