"""The model's tokenizer: encode/decode from tokenizer.json, EOS ids, and a chat template.

Wraps the `tokenizers` library directly (no transformers at serve time). Chat messages use
the folder's Jinja `chat_template` from tokenizer_config.json when jinja2 is importable,
else plain ChatML when the vocabulary has <|im_start|> (SmolLM2, Qwen).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Sequence

from inflight.engine.errors import InflightError, ModelError


class Tokenizer:
    def __init__(self, folder: str | pathlib.Path, eos_token_ids: Sequence[int] = ()):
        from tokenizers import Tokenizer as HFTokenizer

        folder = pathlib.Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{folder} has no tokenizer.json (the engine reads the fast "
                             "tokenizer file of the model folder)")
        self.hf = HFTokenizer.from_file(str(path))
        self._byte_level: bool | None = None  # is the decoder GPT-2 byte-level (token_bytes)
        cfg_path = folder / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        template_file = folder / "chat_template.jinja"  # transformers >= 4.50 saves it apart
        self.chat_template: str | None = (template_file.read_text() if template_file.is_file()
                                          else self.config.get("chat_template"))
        eos = list(eos_token_ids)
        # generation_config.json's eos_token_id is what transformers' generate stops at (chat
        # models list their end-of-turn token there: Llama 3 <|eot_id|>, Gemma <end_of_turn>)
        gen_path = folder / "generation_config.json"
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id") if gen_path.is_file() else None
        for t in [] if gen_eos is None else gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if t not in eos:
                eos.append(t)
        eos_tok = self.config.get("eos_token")
        if isinstance(eos_tok, dict):
            eos_tok = eos_tok.get("content")
        if isinstance(eos_tok, str) and self.hf.token_to_id(eos_tok) is not None:
            if self.hf.token_to_id(eos_tok) not in eos:
                eos.append(self.hf.token_to_id(eos_tok))
        self.eos_token_ids: tuple[int, ...] = tuple(eos)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special tokens (a decode with skip_special_tokens drops them)."""
        return frozenset(i for i, t in self.hf.get_added_tokens_decoder().items() if t.special)

    @functools.cached_property
    def byte_piece_ids(self) -> frozenset[int]:
        """The `<0xXX>` pieces of a byte-fallback tokenizer (Llama 2, Mistral); empty for
        any other (engine/detokenizer.py)."""
        decoder = self.hf.decoder
        if decoder is None or b'"ByteFallback"' not in decoder.__getstate__():
            return frozenset()
        vocab = self.hf.get_vocab()
        return frozenset(i for piece, i in vocab.items()
                         if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"))

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE piece may be part of a UTF-8
        character, so this is not always text)."""
        piece = self.hf.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level is None:
            self._byte_level = type(self.hf.decoder).__name__ == "ByteLevel"
        if self._byte_level:
            table = _gpt2_unicode_to_byte()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # byte fallback
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return self.hf.decode([token_id], skip_special_tokens=False).encode()

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template renders `tools` (a tool-using model's template does);
        the service writes them into a system message of its own otherwise."""
        return bool(self.chat_template) and "tools" in self.chat_template

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tools: Sequence[dict] | None = None) -> str:
        """Render chat `messages` ([{role, content}]) as the model's prompt text; `tools`
        (OpenAI function definitions) go to a template that takes them."""
        extra = {"tools": list(tools)} if tools else {}
        if self.chat_template:
            try:
                import jinja2.sandbox
            except ImportError:
                pass
            else:
                env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                env.globals.update(raise_exception=_template_error, strftime_now=_strftime_now)
                return env.from_string(self.chat_template).render(
                    messages=list(messages), add_generation_prompt=add_generation_prompt,
                    bos_token=self.config.get("bos_token") or "", eos_token=self.config.get("eos_token") or "",
                    **extra)
        if self.hf.token_to_id("<|im_start|>") is None:
            raise ModelError("this model folder has no chat template: send a plain prompt")
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _template_error(message: str):
    """`raise_exception(...)` of chat templates (as transformers defines it): the messages
    break the template's rules (roles not alternating, ...)."""
    raise ChatTemplateError(f"the chat template refused these messages: {message}")


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


class ChatTemplateError(InflightError, ValueError):
    """The model's chat template rejects the messages."""


@functools.lru_cache(maxsize=1)
def _gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are
    shifted to code points 256 and up (the table `tokenizers`' ByteLevel uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}
