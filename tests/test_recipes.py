"""Recipes of real models: the fine-tuning mixture (target tasks and natural-language probes)."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from kdlab.study.config import ConfigError, Profile, SFTSpec, from_dict, read_yaml
from kdlab.study.recipes import sft_mixture
from kdlab.tasks.probes import PROBES

ROOT = Path(__file__).resolve().parents[1]


def _smol() -> Profile:
    return from_dict(Profile, read_yaml((ROOT / "params" / "smol.yaml").read_text()))


def test_mixture_without_probes_is_the_tasks_alone():
    prof = _smol()
    mix = sft_mixture(prof, ["countdown-3"], SFTSpec(steps=1))
    assert [(t.name, w) for t, w in mix] == [("countdown-3", 1.0)]


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_mixture_gives_probes_their_share_equally(share):
    prof = _smol()
    mix = sft_mixture(prof, ["countdown-3"], SFTSpec(steps=1, probes=share))
    weights = {t.name: w for t, w in mix}
    assert weights["countdown-3"] == pytest.approx(1 - share)
    probe_w = [w for name, w in weights.items() if name != "countdown-3"]
    assert len(probe_w) == len(PROBES) and all(w == pytest.approx(share / len(PROBES)) for w in probe_w)
    assert sum(weights.values()) == pytest.approx(1.0)


def test_probe_references_answer_their_own_question():
    prof = _smol()
    _, (probe, _), *_ = sft_mixture(prof, ["countdown-3"], SFTSpec(steps=1, probes=0.5))
    train = probe.problems("train", 50, seed=0)
    test_prompts = {p.prompt for p in probe.problems("test", 50, seed=0)}
    assert not test_prompts & {p.prompt for p in train}  # trained on train, forgetting measured on test
    assert all(probe.score(p, probe.reference(p, random.Random(0))) == 1.0 for p in train)


def test_probe_share_out_of_range_is_refused():
    raw = read_yaml((ROOT / "params" / "smol.yaml").read_text())
    raw["pretrained"]["student_sft"]["probes"] = 1.0
    with pytest.raises(ConfigError, match="probes"):
        from_dict(Profile, raw)
    assert dataclasses.asdict(_smol().pretrained.student_sft)["probes"] == 0.5
