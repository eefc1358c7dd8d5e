"""A character-level tokenizer saved as a normal Hugging Face tokenizer.

Every printable ASCII character is one token, plus three special tokens. It is a
``PreTrainedTokenizerFast`` backed by a ``tokenizers`` WordLevel model, so
``AutoTokenizer.from_pretrained(dir)`` loads it back with no custom code.
"""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIALS = (PAD, BOS, EOS)
ALPHABET = "".join(chr(c) for c in range(32, 127))  # printable ASCII, space included
assert set(string.ascii_letters + string.digits) <= set(ALPHABET)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The kdlab char tokenizer: ids 0..2 are <pad>, <s>, </s>; then the 95 ASCII chars."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD,
        model_max_length=4096, clean_up_tokenization_spaces=False, padding_side="left",
    )
    return tok


def check_text(text: str, what: str = "text") -> str:
    """Reject characters the tokenizer cannot represent (they would silently become <pad>)."""
    bad = sorted({ch for ch in text if ch not in ALPHABET})
    if bad:
        raise ValueError(f"{what} contains characters outside printable ASCII: {bad!r}")
    return text


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | Path) -> None:
    tok.save_pretrained(str(directory))


# Fast paths used on hot loops; equal to the HF tokenizer's ids (tested).
_OFFSET = len(SPECIALS)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
VOCAB_SIZE = _OFFSET + len(ALPHABET)


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens). Raises ValueError on non-ASCII input."""
    ids = [ord(ch) - 32 + _OFFSET for ch in text]
    if any(not (_OFFSET <= i < VOCAB_SIZE) for i in ids):
        check_text(text)
    return ids


def decode(ids: list[int]) -> str:
    """Text of ``ids``, stopping at the first </s> and skipping <pad>/<s>."""
    out = []
    for i in ids:
        if i == EOS_ID:
            break
        if i >= _OFFSET:
            out.append(chr(i - _OFFSET + 32))
    return "".join(out)
