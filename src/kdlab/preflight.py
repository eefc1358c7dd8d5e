"""Checks of everything a profile names on disk, before any work and before anything is written.

``check_profile`` raises ``ConfigError`` with one line that names the key, the value and the
problem. For a real profile (``pretrained.student`` set) it checks that

- every checkpoint path exists and loads as a Hugging Face config and tokenizer (weights are not
  loaded: an 8B teacher would take minutes);
- teacher and student tokenizers agree token for token (the first mismatches shown);
- every data file exists and every row has the fields its kind needs (the task is built);
- the follow-ups that need kdlab's toy tasks (RLVR on countdown, the style teacher, harder
  countdown variants) are not asked for.

- no path is a placeholder such as ``/path/to/...`` (the example profiles' stand-ins).
"""
from __future__ import annotations

from pathlib import Path

from .config import PLACEHOLDER, ConfigError, Profile


def _checkpoint(key: str, path: str):
    """The tokenizer of the HF checkpoint directory at ``path`` (config checked too)."""
    from transformers import AutoConfig

    from .hf import load_tokenizer

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {path!r} does not exist")
    if not (p / "config.json").is_file():
        raise ConfigError(f"{key}: {path!r} is not a Hugging Face checkpoint directory (no config.json)")
    try:
        AutoConfig.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001 - any failure to read the config is the user's to fix
        raise ConfigError(f"{key}: {path!r}: its config.json does not load: {type(e).__name__}: {e}") from None
    try:
        return load_tokenizer(p)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{key}: {path!r}: its tokenizer does not load: {type(e).__name__}: {e}") from None


def _data_file(key: str, kind: str, path: str, eval_only: bool, max_new_tokens: int) -> None:
    from . import materials

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
    if profile.rlvr.enabled:
        raise ConfigError("rlvr.enabled: the RLVR follow-up runs on kdlab's countdown tasks and toy models only; "
                          "set it to false for a pretrained profile")
    if profile.style.enabled:
        raise ConfigError("style.enabled: the style teacher is a toy model; for real checkpoints use "
                          "pretrained.teacher_system_prompt (a system turn only the teacher sees)")
    if profile.eval.harder and not any(t.kind == "countdown" for t in pre.tasks):
        raise ConfigError(f"eval.harder: {profile.eval.harder} are countdown variants; a pretrained profile has them "
                          "only with a countdown task")
    from .hf import check_same_vocab
    from .schema import IMPORTABLE, SFT_TEACHER

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
