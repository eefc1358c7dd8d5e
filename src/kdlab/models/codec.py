"""How a model's tokenizer turns task text into token ids and back: the one difference between toy
and real models that the engine (sampling, distillation, evaluation) has to know about.

- ``CharCodec``: kdlab's character tokenizer (``kdlab.models.tokenizer``): prompt = <s> + characters,
  pad 0, one stop id (</s>), 98 ids.
- ``HFCodec``: any Hugging Face tokenizer: the chat template (when it has one) renders the user
  turn, pad id (the pad token, else eos: Llama-3 has none), every stop id (the tokenizer's eos
  and the generation config's: Llama-3 instruct stops on two), and ``vocab_size`` = the
  tokenizer's size, to which logits are cut (Qwen2.5 pads its embedding rows beyond it).

Both give ``prompt(text, system=None)`` (ids), ``completion(text)`` (ids of a reference answer,
ending in a stop id), ``decode(ids)`` (text up to the first stop), ``pad_id``, ``stop_ids``,
``vocab_size``, ``eval_batch_size`` (prompts per generation batch in evaluation) and
``single_token(text)`` (the id of a text that is one token wherever it stands, else None).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from .tokenizer import BOS_ID, encode, decode
from .hf import pad_id_of, shared_vocab_size, stop_ids


@dataclass(frozen=True)
class CharCodec:
    """kdlab's character tokenizer. ``system`` (a teacher-only instruction) is prefixed as text."""

    pad_id: int = 0
    stop_ids: tuple[int, ...] = (2,)
    vocab_size: int = 98
    eval_batch_size: int = 512

    def prompt(self, text: str, system: str | None = None) -> list[int]:

        return [BOS_ID] + encode(f"{system}{text}" if system else text)

    def completion(self, text: str) -> list[int]:

        return encode(text) + [self.stop_ids[0]]

    def decode(self, ids: Sequence[int]) -> str:

        return decode(list(ids))

    def single_token(self, text: str) -> int | None:
        """The one id of ``text`` when it is a single token wherever it stands (a character), else None."""
        ids = encode(text)
        return ids[0] if len(ids) == 1 else None


@dataclass(frozen=True)
class HFCodec:
    """A Hugging Face tokenizer with its chat template, pad id, stop ids and vocabulary size."""

    tokenizer: Any = field(repr=False)
    pad_id: int = 0
    stop_ids: tuple[int, ...] = ()
    vocab_size: int = 0
    max_prompt_tokens: int | None = None
    eval_batch_size: int = 16

    @classmethod
    def of(cls, tokenizer: Any, *models: Any, max_prompt_tokens: int | None = None,
           eval_batch_size: int = 16) -> "HFCodec":
        """The codec of ``tokenizer`` for ``models`` (their stop ids are added; every model's
        output layer must cover the tokenizer)."""

        stops: set[int] = set()
        for m in models or (None,):
            stops.update(stop_ids(tokenizer, m))
        return cls(tokenizer, pad_id_of(tokenizer), tuple(sorted(stops)), shared_vocab_size(tokenizer, *models),
                   max_prompt_tokens, eval_batch_size)

    @property
    def templated(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, text: str, system: str | None = None) -> str:
        """The text the model sees: the chat template on one user turn (plus an optional system
        turn) with the generation prompt; without a template, ``text`` (after ``system``)."""
        if self.templated:
            turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        return f"{system}\n\n{text}" if system else text

    def prompt(self, text: str, system: str | None = None) -> list[int]:
        """Ids of the rendered prompt. A chat template writes its special tokens as text, so they
        are not added twice; a raw prompt gets the tokenizer's usual ones (Llama's BOS). A prompt
        longer than ``max_prompt_tokens`` is an error, never truncated."""
        if not isinstance(text, str):
            raise ValueError(f"prompt text must be a str, got {text!r}")
        ids = list(self.tokenizer(self.render(text, system), add_special_tokens=not self.templated)["input_ids"])
        if not ids:
            raise ValueError(f"prompt {text[:40]!r} encodes to no tokens")
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise ValueError(f"a prompt is {len(ids)} tokens long, more than max_prompt_tokens={self.max_prompt_tokens}: "
                             f"{text[:60]!r}...")
        return ids

    def completion(self, text: str) -> list[int]:
        """Ids of an assistant answer, ending in the tokenizer's eos (the end of a chat turn)."""
        eos = self.tokenizer.eos_token_id
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [eos if eos is not None else self.stop_ids[0]]

    def decode(self, ids: Sequence[int]) -> str:
        ids = list(ids)
        for i, t in enumerate(ids):
            if t in self.stop_ids:
                ids = ids[:i]
                break
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def single_token(self, text: str) -> int | None:
        """None: a BPE tokenizer may merge ``text`` with its neighbours ("#" into "#1"), so no one id
        marks it wherever it stands."""
        return None


Codec = CharCodec | HFCodec
CHAR = CharCodec()
