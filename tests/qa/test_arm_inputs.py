"""task_options: a spec's [chat] defaults reach the tasks that can chat, and lm-eval's multiturn default."""

from __future__ import annotations

from qa.run.arm_inputs import task_options
from qa.files.spec import ChatSettings, TaskSpec


def test_chat_defaults_apply_to_tasks_that_chat_and_multiturn_follows_chat() -> None:
    chat = ChatSettings(chat=True, system_prompt="Be brief.", chat_template_kwargs={"enable_thinking": False})
    gsm = task_options(TaskSpec(name="gsm8k_cot_llama"), chat)
    assert gsm.chat and gsm.system_prompt == "Be brief." and gsm.fewshot_as_multiturn  # lm-eval's default with chat
    assert dict(gsm.chat_template_kwargs) == {"enable_thinking": False}
    own = task_options(TaskSpec(name="gsm8k_cot_llama", fewshot_as_multiturn=False, system_prompt="Own."), chat)
    assert own.chat and not own.fewshot_as_multiturn and own.system_prompt == "Own."  # the task's own settings win
    probe = task_options(TaskSpec(name="wikitext_kl"), chat)  # cannot chat: [chat] is not applied
    assert not probe.chat and probe.system_prompt is None and not probe.fewshot_as_multiturn
    plain = task_options(TaskSpec(name="gsm8k"))
    assert not plain.chat and not plain.fewshot_as_multiturn
    assert task_options(TaskSpec(name="gsm8k", think_tags=[])).think_tags is None
