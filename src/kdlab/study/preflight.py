"""Checks of everything a profile names on disk and needs from the machine, before any work and
before anything is written.

``check_profile`` raises ``ConfigError`` with one line that names the key, the value and the
problem. For a real profile (``pretrained.student`` set) it checks that

- every checkpoint path exists and loads as a Hugging Face config and tokenizer (weights are not
  loaded: an 8B teacher would take minutes);
- teacher and student tokenizers agree token for token (the first mismatches shown);
- every data file exists and every row has the fields its kind needs (the task is built);
- the follow-ups that read countdown (RLVR, the style runs, harder countdown variants) have a
  countdown task among ``pretrained.tasks``.

- no path is a placeholder such as ``/path/to/...`` (the example profiles' stand-ins).

``check_machine`` checks what any profile needs from this machine: the GPU that
``pretrained.device`` names exists (``cuda`` with no GPU, ``cuda:3`` on a one-GPU machine are
refused), and the optional packages its path needs are importable: ``gguf`` to import a model
kdlab converts from a package (SmolLM2; not needed once it is in the model store), ``ray`` to
send the runs to a cluster. The remedy names the extra of ``pyproject.toml`` that installs each.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

from .config import PLACEHOLDER, ConfigError, Profile
from ..models.hf import load_tokenizer, check_same_vocab
from . import materials
from ..core.schema import IMPORTABLE, SFT_TEACHER
from ..models.smol import imported_path


def _checkpoint(key: str, path: str):
    """The tokenizer of the HF checkpoint directory at ``path`` (config checked too)."""
    from transformers import AutoConfig


    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {path!r} does not exist")
    if not (p / "config.json").is_file():
        raise ConfigError(f"{key}: {path!r} is not a Hugging Face checkpoint directory (no config.json)")
    try:
        AutoConfig.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001 - any failure to read the config is the user's to fix
        raise ConfigError(f"{key}: {path!r}: its config.json does not load: {type(e).__name__}: {_line(e)}") from None
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{key}: {path!r} has a config.json but no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                          "save the model's tokenizer there (tokenizer.save_pretrained(DIR))")
    try:
        return load_tokenizer(p)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{key}: {path!r}: its tokenizer does not load: {type(e).__name__}: {_line(e)}") from None


# The files a Hugging Face tokenizer is saved as (fast, sentencepiece, BPE and WordPiece forms).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def _line(e: Exception, limit: int = 300) -> str:
    """An exception's message on one line, cut to ``limit`` characters (transformers' are long)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _data_file(key: str, kind: str, path: str, eval_only: bool, max_new_tokens: int) -> None:

    if not Path(path).is_file():
        raise ConfigError(f"{key}: {path!r} is not a file")
    try:
        task = materials._real_task(kind, str(Path(path).resolve()), Path(path).stem, eval_only, max_new_tokens)
    except Exception as e:  # noqa: BLE001 - a row without the fields its kind needs, an unreadable file, ...
        raise ConfigError(f"{key}: {path!r} is not a valid {kind} file: {str(e).splitlines()[0]}") from None
    if not task.all_problems:
        raise ConfigError(f"{key}: {path!r} has no usable {kind} rows")


def check_profile(profile: Profile) -> None:
    """Raise ``ConfigError`` for the first problem with what the profile names on disk."""
    pre = profile.pretrained
    if not pre.student:
        return
    paths = [("pretrained.student", pre.student)]
    paths += [(f"pretrained.tasks[{i}].{f}", getattr(t, f)) for i, t in enumerate(pre.tasks)
              for f in ("train", "test", "teacher")]
    paths += [(f"pretrained.benchmarks[{i}].path", b.path) for i, b in enumerate(pre.benchmarks)]
    for key, value in paths:
        if PLACEHOLDER in value:
            raise ConfigError(f"{key}: {value!r} is a placeholder; replace it with a local path")
    countdown = any(t.kind == "countdown" for t in pre.tasks)
    if profile.rlvr.enabled and not countdown:
        raise ConfigError(f"rlvr.enabled: GRPO's reward is the countdown verifier (rlvr.task {profile.rlvr.task}); "
                          "a pretrained profile has it only with a countdown task in pretrained.tasks")
    if profile.style.enabled and not countdown:
        raise ConfigError(f"style.enabled: the style runs distil countdown (style.task {profile.style.task}); "
                          "a pretrained profile has them only with a countdown task in pretrained.tasks")
    if profile.eval.harder and not any(t.kind == "countdown" for t in pre.tasks):
        raise ConfigError(f"eval.harder: {profile.eval.harder} are countdown variants; a pretrained profile has them "
                          "only with a countdown task")

    # an imported base is made by the models phase (its tokenizer is checked when it loads)
    student_tok = None if pre.student in IMPORTABLE else _checkpoint("pretrained.student", pre.student)
    for i, t in enumerate(pre.tasks):
        key = f"pretrained.tasks[{i}]"
        if t.teacher != SFT_TEACHER:  # an 'sft' teacher is the student's base fine-tuned: same tokenizer
            tok = _checkpoint(f"{key}.teacher", t.teacher)
            try:
                if student_tok is not None:
                    check_same_vocab(tok, student_tok, names=("teacher", "student"))
            except ValueError as e:
                raise ConfigError(f"{key}.teacher: {t.teacher!r} and pretrained.student {pre.student!r}: {e}") from None
        if t.kind != "countdown":
            _data_file(f"{key}.train", t.kind, t.train, False, t.max_new_tokens)
        if t.test:
            _data_file(f"{key}.test", t.kind, t.test, True, t.max_new_tokens)
    for i, b in enumerate(pre.benchmarks):
        _data_file(f"pretrained.benchmarks[{i}].path", b.kind, b.path, True, b.max_new_tokens)


def check_machine(profile: Profile, models_root: Path, ray_address: str | None = None,
                  ray_key: str = "pretrained.ray_address") -> None:
    """Raise ``ConfigError`` when this machine lacks what the profile needs: the GPU
    ``pretrained.device`` names, ``gguf`` for a model import still to do (``models_root`` is the
    model store), ``ray`` when the runs go to a cluster (``ray_address``, given by ``ray_key``)."""
    _check_device("pretrained.device", profile.pretrained.device)

    if profile.pretrained.student in IMPORTABLE:

        if imported_path(Path(models_root)) is None:
            _require("gguf", f"pretrained.student: {profile.pretrained.student!r} is imported from a GGUF file")
    if ray_address:
        _require("ray", f"{ray_key}: {ray_address!r} sends the runs to a Ray cluster")


def _check_device(key: str, device: str) -> None:
    """The GPU ``device`` names (cuda, cuda:N) exists on this machine; auto and cpu always do."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build of PyTorch" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(f"{key}: {device!r} asks for a GPU but this machine has none ({build}); set {key} to "
                          "auto or cpu, or run on a machine with a GPU and a CUDA build of PyTorch")
    index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"{key}: {device!r} but this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}; "
                          f"choose one of them, or cuda (the first)")


def _require(package: str, why: str) -> None:
    """``ConfigError`` naming ``why`` the package is needed and how to install it, when it is not
    importable (looked up without importing it)."""
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(f"{why}, which needs the package {package!r}, not importable here; {install_hint(package)}")


def install_hint(package: str) -> str:
    """``pip install 'kdlab[EXTRA]'`` for the first extra of kdlab's metadata (pyproject.toml)
    that lists ``package`` other than ``dev``; else ``pip install 'SPEC'`` with the version
    kdlab asks for."""
    try:
        requires = importlib.metadata.requires("kdlab") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    spec = package
    for req in requires:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)([^;]*?)\s*(?:;\s*extra\s*==\s*[\"']([^\"']+)[\"'])?\s*", req)
        if m and m.group(1).lower().replace("_", "-") == package.lower().replace("_", "-"):
            if m.group(3) and m.group(3) != "dev":
                return f"pip install 'kdlab[{m.group(3)}]'"
            spec = f"{m.group(1)}{m.group(2).strip()}"
    return f"pip install '{spec}'"


def worker_gpus(profile: Profile, workers: int, device_count: int | None = None,
                visible: str | None = None) -> list[str | None]:
    """The GPU each worker process serves, as its ``CUDA_VISIBLE_DEVICES`` (None: leave it as it
    is): on a machine with several GPUs, a real profile whose device is ``auto`` or ``cuda`` runs
    one worker per GPU (worker i on GPU i, round robin when there are more workers than GPUs), each
    worker a warm process that keeps its models loaded from run to run (``materials.RESIDENT``).
    A profile naming one GPU (``cuda:N``), a CPU profile, one GPU or one worker changes nothing.
    ``device_count`` / ``visible``: this machine's (torch's count, the environment's list)."""
    device = profile.pretrained.device if materials.is_real(profile) else "cpu"
    if device not in ("auto", "cuda") or workers < 2:
        return [None] * workers
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_count < 2:
        return [None] * workers
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    ids = [v.strip() for v in visible.split(",") if v.strip()][:device_count] if visible else []
    ids = ids or [str(i) for i in range(device_count)]
    return [ids[i % len(ids)] for i in range(workers)]
