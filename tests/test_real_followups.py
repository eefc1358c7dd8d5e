"""RLVR (GRPO) and the style experiment on real Hugging Face checkpoints, through the codec: tiny
random Qwen2 / Llama models with byte-level BPE tokenizers (``tiny_hf``) on countdown in natural
language, then ``kdlab study`` of a tiny real-checkpoint profile with both follow-ups enabled."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import yaml

from kdlab.models.codec import HFCodec
from kdlab.study.config import load_profile
from kdlab.engine.data import ProblemPool
from kdlab.models.hf import load_pretrained
from kdlab.engine.rlvr import RLVRConfig, grpo_train
from kdlab.evaluation.evaluate import accuracy
from kdlab.evaluation.style import (NL_INSTRUCTION, StyledCountdownTask, detect_style, student_prompt, style_report,
                                    style_teacher_tasks, teacher_prompt)
from kdlab.tasks.countdown import NaturalCountdownTask
from tiny_hf import build_pair, write_synthetic_choice

FAMILIES = ("qwen2", "llama")


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    """(family, model, codec) of a tiny random student checkpoint."""
    _, student = build_pair(tmp_path_factory.mktemp(request.param), request.param)
    model, tok = load_pretrained(student, "fp32", "cpu")
    return request.param, model, HFCodec.of(tok, model)


class ParityCountdown(NaturalCountdownTask):
    """Countdown prompts with a reward a random model earns half the time (even completion length),
    so that groups have non-zero advantages; records what it scored."""

    def __init__(self) -> None:
        super().__init__("countdown-3", max_new_tokens=6)
        self.seen: list[str] = []

    def score(self, problem, completion: str) -> float:
        self.seen.append(completion)
        return float(len(completion) % 2 == 0)


def test_grpo_trains_a_real_checkpoint_through_its_codec(tiny):
    family, model, codec = tiny
    task = ParityCountdown()
    pool = ProblemPool(task, "train", 40, seed=0)
    before = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.named_parameters()}
    cfg = RLVRConfig(steps=2, prompts_per_step=2, group_size=4, lr=1e-2, dtype="bf16", seed=0, kl_coef=0.1)
    test = task.problems("test", 3)
    out = grpo_train(model, task, cfg, pool, eval_fn=lambda m: accuracy(m, task, test, codec=codec), progress=False,
                     codec=codec)
    assert len(out["history"]) == 2 and not out["nan"]
    for h in out["history"]:
        assert 1.0 <= h["length"] <= 6.0  # tokens of the real tokenizer, at most max_new_tokens
        assert h["ratio_mean"] == pytest.approx(1.0)  # one inner epoch: the sampling policy itself
        assert math.isfinite(h["loss"]) and math.isfinite(h["kl"])
    assert out["history"][0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as its reference
    assert any(h["zero_adv_groups"] < 1.0 and h["grad_norm"] > 0 for h in out["history"])
    changed = sum(int((p.detach() != before[k]).sum()) for k, p in model.named_parameters())
    assert changed > 0 and all(p.dtype == torch.bfloat16 for p in model.parameters())
    # the verifier saw decoded text: no special tokens, and real words of the byte-level vocabulary
    stops = [codec.tokenizer.convert_ids_to_tokens(i) for i in codec.stop_ids]
    assert task.seen and not any(s in t for t in task.seen for s in stops)
    assert 0.0 <= out["initial_accuracy"] <= 1.0 and 0.0 <= out["final_accuracy"] <= 1.0


def test_natural_style_references_instruction_and_detector():
    plain, alt = (t for t, _ in style_teacher_tasks("countdown-3", natural=True, max_new_tokens=40))
    base = NaturalCountdownTask("countdown-3", max_new_tokens=40)
    problems = plain.problems("train", 30, seed=0)
    instructed = alt.problems("train", 30, seed=0)
    assert [p.prompt for p in problems] == [p.prompt for p in base.problems("train", 30, seed=0)]
    assert (plain.name, alt.name) == ("countdown-3-plain-nl", "countdown-3-alt-instr-nl")
    for p, a in zip(problems, instructed):
        assert a.prompt == p.prompt + NL_INSTRUCTION == teacher_prompt(p) == teacher_prompt(a)
        assert student_prompt(a) == student_prompt(p) == p.prompt and a.key == p.key
        p_ref = plain.reference(p, random.Random(p.key))
        a_ref = alt.reference(a, random.Random(p.key))
        assert p_ref == base.reference(p, random.Random(p.key))  # plain = the natural task's own reference
        assert (detect_style(p_ref, natural=True), detect_style(a_ref, natural=True)) == ("plain", "alt")
        assert plain.score(p, p_ref) == alt.score(a, a_ref) == 1.0
        assert a_ref.split("Answer:")[1] == p_ref.split("Answer:")[1]  # the answer stays an expression
    assert detect_style("34 p 56 = 90. Answer: 90", natural=True) == "none"
    assert detect_style("34p56=90, 90-12=78. Answer: 1", natural=True) == "none"  # mixed
    assert detect_style("Answer: 34+56", natural=True) == "none"  # no trace
    with pytest.raises(ValueError, match="trace"):
        StyledCountdownTask(natural=True, trace="search")


def test_style_report_on_a_real_checkpoint(tiny):
    _, model, codec = tiny
    task = StyledCountdownTask("countdown-3", "plain", instructed=False, natural=True, max_new_tokens=5)
    problems = task.problems("test", 4)
    rep = style_report(model, task, problems, codec=codec)
    rep_t = style_report(model, task, problems, prompt=teacher_prompt, codec=codec)
    assert rep["n"] == rep_t["n"] == 4 and rep["plain"] + rep["alt"] + rep["none"] == 4
    assert 0.0 <= rep["accuracy"] <= 1.0 and set(rep_t) == set(rep)


# ------------------------------------------------------------------------- kdlab study, end to end


def write_followups_profile(root: Path, family: str = "qwen2") -> Path:
    """A real-checkpoint profile on countdown-3 in natural language with RLVR and style enabled,
    every part at a few steps: one grid cell (on-policy, forward KL), GRPO from the base and from
    that run's student, one style run from a style teacher fine-tuned for 2 steps; a made-up
    choice benchmark for forgetting."""
    root.mkdir(parents=True, exist_ok=True)
    teacher, student = build_pair(root, family)
    bench = write_synthetic_choice(root / "bench.jsonl", n=6, seed=3)
    profile = {
        "name": "hf-followups",
        "pretrained": {
            "student": str(student),
            "tasks": [{"name": "countdown-3", "kind": "countdown", "teacher": str(teacher), "max_new_tokens": 6}],
            "benchmarks": [{"kind": "choice", "path": str(bench), "name": "bench", "max_new_tokens": 4}],
            "n_benchmark": 3, "device": "cpu", "gradient_checkpointing": False,
            "teacher_sft": {"steps": 2, "batch_size": 4},
        },
        "distill": {"steps": 2, "batch_size": 4, "offpd_pool": 4},
        "eval": {"n_test": 4, "n_probe": 2, "pass_n": 2, "pass_problems": 2, "pass_ks": [1, 2]},
        "grid": {"tasks": ["countdown-3"], "policies": ["on"], "kls": ["forward"], "lrs": [1.0e-4], "seeds": [0],
                 "lambdas": []},
        "rlvr": {"enabled": True, "task": "countdown-3", "starts": ["base", "on/forward/0"], "steps": 2,
                 "prompts_per_step": 2, "group_size": 2, "eval_every": 1, "n_eval": 3},
        "style": {"enabled": True, "task": "countdown-3", "n_test": 3, "policies": ["on"], "kls": ["forward"],
                  "teacher_steps": 2},
    }
    path = root / "hf-followups.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def followups_profile(tmp_path_factory) -> Path:
    return write_followups_profile(tmp_path_factory.mktemp("followups"), "llama")


def test_real_style_teacher_is_the_base_fine_tuned_on_natural_styled_countdown(followups_profile, tmp_path):
    from kdlab.study.style_teacher import style_teacher_mixture, style_teacher_path, style_teacher_recipe

    profile = load_profile(followups_profile)
    mix = style_teacher_mixture(profile)
    assert [(t.name, w) for t, w in mix] == [("countdown-3-plain-nl", 0.5), ("countdown-3-alt-instr-nl", 0.5)]
    assert all(t.max_new_tokens == 6 for t, _ in mix)  # the profile's countdown budget, in real tokens
    assert style_teacher_recipe(profile).steps == 2
    with_probes = load_profile(followups_profile, {"pretrained.teacher_sft.probes": 0.3})
    weights = [w for _, w in style_teacher_mixture(with_probes)]
    assert len(weights) == 9 and sum(weights) == pytest.approx(1.0) and weights[:2] == pytest.approx([0.35, 0.35])
    with pytest.raises(FileNotFoundError, match="teacher-style-countdown-3"):
        style_teacher_path(profile, tmp_path / "models", progress=False, train=False)


@pytest.mark.parametrize("section", ["rlvr", "style"])
def test_preflight_takes_real_follow_ups_with_a_countdown_task_only(followups_profile, section):
    from kdlab.study.config import ConfigError
    from kdlab.study.preflight import check_profile

    check_profile(load_profile(followups_profile))  # countdown-3 is a task: RLVR and style are accepted
    other = load_profile(followups_profile, {"rlvr.enabled": section == "rlvr", "style.enabled": section == "style",
                                             "pretrained.tasks": [{"name": "mc", "kind": "choice", "train": "x.jsonl",
                                                                   "teacher": "y"}],
                                             "grid.tasks": ["mc"], "grid.lambda_tasks": ["mc"]})
    with pytest.raises(ConfigError, match=rf"^{section}\.enabled: .*countdown task"):
        check_profile(other)


@pytest.mark.slow
def test_real_checkpoint_study_runs_rlvr_and_style_end_to_end(tmp_path):
    from kdlab.study.followups import rlvr_starts, style_cells
    from kdlab.study.plan import notebook_finished
    from kdlab.study.runner import run_study
    from test_study import ensure_kernel

    ensure_kernel()
    path = write_followups_profile(tmp_path / "data")
    outputs = tmp_path / "out"
    assert run_study(path, outputs, workers=1, progress=False) == 0
    profile, study = load_profile(path), outputs / "hf-followups"
    starts = rlvr_starts(profile)
    assert [s.spec for s in starts] == ["base", "on/forward/0"]
    started = {}
    for start in starts:
        m = json.loads((study / "rlvr" / start.job_id / "metrics.json").read_text())
        assert m["steps_done"] == 2 and not m["nan"] and m["task"] == "countdown-3"
        started[start.spec] = m
        assert 0.0 <= m["initial_accuracy"] <= 1.0 and 0.0 <= m["final_accuracy"] <= 1.0
        history = json.loads((study / "rlvr" / start.job_id / "history.json").read_text())
        assert all(1 <= h["length"] <= 6 for h in history)  # real-tokenizer tokens, within the budget
    # GRPO from the distilled real student the grid run saved (save_pretrained + its tokenizer)
    assert started["on/forward/0"]["start"].endswith(f"runs/{starts[1].run_id}/student")
    assert started["on/forward/0"]["start_sha256"] != started["base"]["start_sha256"]
    (cell,) = style_cells(profile)
    m = json.loads((study / "style" / cell.run_id / "metrics.json").read_text())
    assert m["experiment"] == "style" and m["model_kind"] == "pretrained" and m["steps_done"] == 2
    assert "teacher-style-countdown-3-" in m["teacher_path"]
    for prefix in ("", "base_"):
        counts = [m[f"{prefix}style_{k}"] for k in ("plain", "alt", "none")]
        assert sum(counts) == 3 and 0.0 <= m[f"{prefix}style_accuracy"] <= 1.0
    rows = {r["model"]: r for r in json.loads((study / "models.json").read_text())}
    assert rows["style teacher"]["n_params"] > 0 and 0.0 <= rows["style teacher"]["instructed_accuracy"] <= 1.0
    for nb in ("91_rlvr", "92_style"):
        assert notebook_finished(study / "analysis" / f"{nb}.ipynb"), nb
    assert "Traceback" not in (study / "report.html").read_text()
