"""Real Hugging Face checkpoints (Llama, Qwen2, ...) from local directories, on CPU or GPU.

Only loading lives here: sampling, distillation and evaluation are kdlab's one engine
(``kdlab.engine.rollout``, ``kdlab.engine.distill``, ``kdlab.evaluation.evaluate``), which sees a real tokenizer through
``kdlab.models.codec.HFCodec``. Real checkpoints differ from the toy ones in what the codec records:
Llama-3 has no pad token and several stop tokens, Qwen2.5 pads its embedding matrix beyond the
tokenizer (the 7B and the 1.5B by different amounts), and training runs on a GPU.

- ``load_pretrained``: model + tokenizer from a local directory, in a chosen dtype and device;
- ``check_same_vocab`` / ``shared_vocab_size``: teacher and student must agree token for token;
  logits are cut to the tokenizer's size so that embedding padding never enters a KL;
- ``stop_ids`` / ``pad_id_of``: the ids a codec needs.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..core.dtypes import DTYPES


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

def pick_device() -> str:
    """"cuda" when a CUDA device is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from "bf16" / "fp16" / "fp32" (or a torch.dtype, returned as is)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or a torch.dtype, got {dtype!r}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> ``pick_device()``; anything else must be a valid torch device string."""
    if device == "auto":
        return torch.device(pick_device())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
    return dev


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a checkpoint directory, set to pad on the left."""
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.padding_side = "left"
    return tok


def load_pretrained(path: str | Path, dtype: str | torch.dtype = "bf16", device: str | torch.device = "auto",
                    gradient_checkpointing: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local HF checkpoint directory.

    The model comes back in eval mode on ``device`` with parameters in ``dtype`` (no fp32 master
    copy: bf16 training then loses updates smaller than one bf16 step, as in the paper).
    ``gradient_checkpointing`` trades compute for activation memory during training.
    """
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"path {str(path)!r} is not a Hugging Face checkpoint directory (no config.json)")
    torch_dtype = resolve_dtype(dtype)
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    model.to(dev)
    if gradient_checkpointing:  # transformers 5.x renamed it; 4.x has only the old name
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False  # training forward passes; sampling passes use_cache explicitly
    return model.eval(), load_tokenizer(path)


# --------------------------------------------------------------------------------------------
# Vocabulary and special tokens
# --------------------------------------------------------------------------------------------

def _id_to_token(tok: PreTrainedTokenizerBase) -> dict[int, str]:
    return {i: t for t, i in tok.get_vocab().items()}


def check_same_vocab(tok_a: PreTrainedTokenizerBase, tok_b: PreTrainedTokenizerBase,
                     names: tuple[str, str] = ("tok_a", "tok_b"), show: int = 5) -> None:
    """Raise ValueError unless the two tokenizers map every id to the same token string.

    Distillation compares the two models' distributions id by id over the full vocabulary, so
    this must hold exactly (added and special tokens included). The message names the sizes and
    the first ``show`` mismatches as (id, token_a, token_b), with None for an absent id.
    """
    a, b = _id_to_token(tok_a), _id_to_token(tok_b)
    if a == b:
        return
    mismatches = [(i, a.get(i), b.get(i)) for i in sorted(set(a) | set(b)) if a.get(i) != b.get(i)]
    raise ValueError(
        f"vocabularies differ: {names[0]} has {len(a)} tokens, {names[1]} has {len(b)}; "
        f"{len(mismatches)} ids differ, first (id, {names[0]}, {names[1]}): {mismatches[:show]}")


def shared_vocab_size(tokenizer: PreTrainedTokenizerBase, *models: torch.nn.Module) -> int:
    """``len(tokenizer)``, after checking every model's output layer covers it.

    Checkpoints may pad the embedding matrix beyond the tokenizer (Qwen2.5-7B: 152064 rows,
    Qwen2.5-1.5B: 151936, tokenizer: 151665). The padding rows are never real tokens, so logits
    are cut to this size before mixing or comparing distributions.
    """
    size = len(tokenizer)
    for m in models:
        rows = m.get_output_embeddings().weight.shape[0]
        if rows < size:
            raise ValueError(f"model {type(m).__name__} has {rows} output rows, fewer than the tokenizer's {size} tokens")
    return size


def stop_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module | None = None) -> list[int]:
    """Every id that ends a response: the tokenizer's eos plus the model's generation-config
    eos ids (Llama-3 instruct stops on both <|eot_id|> and <|end_of_text|>). Sorted, unique."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None) if model is not None else None
    extra = getattr(gen, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra is not None:
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("tokenizer has no eos_token_id and the model's generation config names none")
    return sorted(ids)


def pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id used for padding: the tokenizer's pad token, else its eos (Llama-3 has no pad).
    Padding is always masked out, so only its being a valid id matters."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("tokenizer has neither a pad_token_id nor an eos_token_id to pad with")
