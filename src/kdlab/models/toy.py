"""Tiny Llama / Qwen2 models built from ``transformers`` configs, and checkpoint I/O.

Every checkpoint kdlab writes is a normal Hugging Face directory (``config.json``,
``model.safetensors``, the tokenizer files) plus ``kdlab.json`` with provenance. Its weights are
identified by the SHA-256 of ``model.safetensors``; ``load_checkpoint`` checks it on every load.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel,
                          Qwen2Config, Qwen2ForCausalLM)

from ..core.atomic import write_dir_atomic
from ..core.faults import CorruptCheckpoint
from ..core.schema import PRESETS
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, build_tokenizer

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}

# Size presets (kdlab.core.schema.PRESETS): parameter counts are for VOCAB_SIZE=98 with tied embeddings,
# the same for both families up to Qwen2's attention biases.
MAX_POSITIONS = 512
SHIPPED_DIR = Path(__file__).resolve().parents[3] / "checkpoints"  # checkpoints the repository ships


def model_config(family: str, size: str | dict[str, int]):
    """A ``LlamaConfig`` / ``Qwen2Config`` for a preset name or an explicit dict of sizes."""
    if family not in FAMILIES:
        raise ValueError(f"model family {family!r} is not one of {sorted(FAMILIES)}")
    if isinstance(size, str):
        if size not in PRESETS:
            raise ValueError(f"model size {size!r} is not one of {sorted(PRESETS)}")
        size = PRESETS[size]
    cfg_cls, _ = FAMILIES[family]
    return cfg_cls(vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
                   pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, rope_theta=10000.0,
                   attn_implementation="sdpa", **size)


def build_model(family: str, size: str | dict[str, int], seed: int = 0) -> PreTrainedModel:
    """A freshly initialised causal LM (fp32), deterministic in ``seed``."""
    cfg = model_config(family, size)
    _, model_cls = FAMILIES[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(cfg)
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


WEIGHTS = "model.safetensors"
# A shipped checkpoint keeps its weights xz-compressed (bf16 weights pack to about 72%), so that
# more models fit the repository's 20 MB of shipped checkpoints; the hash is the plain file's.
PACKED_WEIGHTS = WEIGHTS + ".xz"


def file_sha256(path: str | Path, packed: bool = False) -> str:
    """SHA-256 of a file's bytes, or with ``packed`` of the bytes an .xz file holds."""
    h = hashlib.sha256()
    with (lzma.open if packed else open)(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_file(directory: str | Path) -> tuple[Path, str]:
    """(the checkpoint's weights file, the SHA-256 of its weights): ``model.safetensors``, else
    the packed ``model.safetensors.xz`` (hashed as the plain bytes it holds); the hash is
    "missing" when there is neither and "unreadable (...)" for a damaged .xz file."""
    directory = Path(directory)
    plain, packed = directory / WEIGHTS, directory / PACKED_WEIGHTS
    if plain.exists() or not packed.exists():
        return plain, file_sha256(plain) if plain.exists() else "missing"
    try:
        return packed, file_sha256(packed, packed=True)
    except (lzma.LZMAError, EOFError) as e:
        return packed, f"unreadable ({e})"


def copy_checkpoint(directory: str | Path, into: str | Path, packed: bool) -> None:
    """Copy checkpoint ``directory`` (weights plain or packed) into ``into`` with its weights
    xz-compressed (``packed``: shipping) or plain (installing a shipped one)."""
    directory, into = Path(directory), Path(into)
    into.mkdir(parents=True, exist_ok=True)
    for f in sorted(directory.iterdir()):
        if f.is_file() and f.name not in (WEIGHTS, PACKED_WEIGHTS):
            shutil.copyfile(f, into / f.name)
    src_packed = not (directory / WEIGHTS).exists()
    reader = lzma.open(directory / PACKED_WEIGHTS, "rb") if src_packed else open(directory / WEIGHTS, "rb")
    writer = lzma.open(into / PACKED_WEIGHTS, "wb", preset=9) if packed else open(into / WEIGHTS, "wb")
    with reader as src, writer as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def save_checkpoint(model: PreTrainedModel, directory: str | Path, meta: dict[str, Any] | None = None) -> str:
    """Write an HF checkpoint atomically (temp dir + rename); returns the weights' SHA-256."""
    shas = []

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp), safe_serialization=True)
        build_tokenizer().save_pretrained(str(tmp))
        shas.append(file_sha256(tmp / WEIGHTS))
        info = dict(meta or {}, sha256=shas[0], n_params=n_params(model),
                    dtype=str(next(model.parameters()).dtype).replace("torch.", ""))
        (tmp / "kdlab.json").write_text(json.dumps(info, indent=2, sort_keys=True))

    write_dir_atomic(directory, fill)
    return shas[0]


def checkpoint_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / "kdlab.json"
    return json.loads(path.read_text()) if path.exists() else {}


def verify_weights(directory: str | Path, expected: str | None = None, params: str = "PROFILE",
                   shipped: bool | None = None) -> None:
    """Refuse (``CorruptCheckpoint``: the file, both hashes, the remedy) a checkpoint whose
    weights (``weights_file``: plain or packed) do not hash to ``expected`` (default: the sha256
    its ``kdlab.json`` records; none recorded: nothing to check). ``params`` names the profile in the remedy;
    ``shipped``: the checkpoint is a shipped one (default: it lies in ``SHIPPED_DIR``)."""
    directory = Path(directory)
    expected = expected or checkpoint_meta(directory).get("sha256")
    if expected is None:
        return
    weights, got = weights_file(directory)
    if got == expected:
        return
    if shipped is None:
        shipped = directory.resolve().parent == SHIPPED_DIR
    remedy = (f"restore it (`git restore checkpoints/{directory.name}`) or train it (`kdlab teachers {params} --rebuild`)"
              if shipped else f"remove {directory} and run `kdlab teachers {params}` to build it again")
    raise CorruptCheckpoint(f"{weights}: sha256 {got} does not match the recorded {expected}; {remedy}")


def load_checkpoint(directory: str | Path, dtype: torch.dtype | None = None, expected_sha256: str | None = None,
                    device: str | torch.device = "cpu") -> PreTrainedModel:
    """Load an HF checkpoint directory after checking its weights' hash (``expected_sha256``,
    default: the one its ``kdlab.json`` records)."""
    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise FileNotFoundError(f"no Hugging Face checkpoint at {directory} (config.json missing)")
    verify_weights(directory, expected_sha256)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype or torch.float32)
    return model.to(device).eval()
