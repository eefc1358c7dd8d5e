"""How distillation and RLVR combine (issue 42): the pipelines' compute matching, their refusals,
the answer lines on constructed tables, and params/tiny-pipelines.yaml end to end."""
import json

import numpy as np
import pandas as pd
import pytest

from kdlab.analysis.findings import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, REPRODUCED
from kdlab.analysis.pipelines import pipeline_answers, pipeline_rows, pipeline_table
from kdlab.core.fields import ConfigError
from kdlab.study.config import load_profile, matched_steps
from kdlab.study.followups import rlvr_starts

from test_study import outputs_with_models, tiny_models  # noqa: F401 (session fixture)


def write(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def profile(tmp_path, repo_root, text):
    return load_profile(write(tmp_path, f"extends: {repo_root}/params/tiny-pipelines.yaml\n" + text))


def test_the_pipelines_from_the_base_get_the_distillations_compute_in_grpo_steps(tmp_path, repo_root):
    p = load_profile(repo_root / "params" / "pipelines.yaml")
    # 150 distillation steps of 32 sequences = 4800 = 150 GRPO steps of 4 x 8, on top of rlvr.steps
    assert p.distill.steps * p.distill.batch_size == 4800 and matched_steps(p) == p.rlvr.steps + 150
    starts = {(s.pipeline, s.seed): s for s in rlvr_starts(p)}
    assert set(starts) == {(name, s) for name in ("distill-rlvr", "rlvr-only", "joint") for s in (0, 1, 2)}
    d = starts[("distill-rlvr", 1)]
    assert d.run_id == "countdown-3_on_reverse_lr0.0001_s1" and d.settings == ()  # rlvr.steps after distillation
    assert dict(starts[("rlvr-only", 0)].settings) == {"steps": matched_steps(p)}
    assert dict(starts[("joint", 2)].settings) == {"steps": matched_steps(p), "kl_reference": "teacher",
                                                   "kl_coef": p.pipelines.joint_kl_coef}
    assert starts[("joint", 2)].job_id == "joint_s2" and starts[("joint", 2)].info()["pipeline"] == "joint"
    t = profile(tmp_path, repo_root, "distill: {steps: 6, batch_size: 8}\nrlvr: {steps: 5, prompts_per_step: 4, "
                                     "group_size: 4}\n")
    assert matched_steps(t) == 5 + 3


@pytest.mark.parametrize("text, needle", [
    ("rlvr: {enabled: false}\n", "pipelines.enabled: the pipelines end with GRPO; set rlvr.enabled: true"),
    ("pipelines: {distilled: base}\n", "pipelines.distilled: 'base' must name a distilled run"),
    ("pipelines: {distilled: off/forward/0}\n", "policy 'off' is not in grid.policies"),
    ("rlvr: {task: countdown-4}\n", "the joint objective needs a teacher of rlvr.task 'countdown-4'"),
    ("pipelines: {joint_kl_coef: 0.0}\n", "pipelines.joint_kl_coef: must be > 0"),
    ("rlvr: {group_size: 3}\n", "are not a whole number of GRPO steps of 12 (rlvr.prompts_per_step x group_size): "
                                "the compute cannot be matched"),
    ("rlvr: {seeds: [0, 5]}\n", "rlvr.seeds: [5] not in grid.seeds [0, 1]"),
])
def test_pipelines_that_cannot_run_are_refused_by_key(tmp_path, repo_root, text, needle):
    with pytest.raises(ConfigError) as err:
        profile(tmp_path, repo_root, text)
    assert needle in str(err.value)


def summary(final, forgetting, seeds=(0, 1, 2), noise=0.005):
    rows = [{"pipeline": p, "seed": s, "final_accuracy": final[p] + noise * (s - 1),
             "forgetting": forgetting[p] + noise * (s - 1), "grpo_steps": 300 if p != "distill-rlvr" else 150}
            for p in final for s in seeds]
    rows.append({"pipeline": None, "seed": 0, "final_accuracy": 0.9, "forgetting": 0.0, "grpo_steps": 150})  # a start
    return pd.DataFrame(rows)


def test_pipeline_answers_order_the_pipelines_and_read_their_forgetting():
    s = summary({"rlvr-only": 0.30, "distill-rlvr": 0.45, "joint": 0.46}, {"rlvr-only": 0.0, "distill-rlvr": -0.05,
                                                                           "joint": -0.001})
    rows = pipeline_rows(s)
    assert len(rows) == 9  # the plain start is not a pipeline
    t = pipeline_table(rows)
    assert list(t.index) == ["rlvr-only", "distill-rlvr", "joint"] and t.loc["joint", "GRPO steps"] == 300
    assert t.loc["distill-rlvr", "final accuracy"] == pytest.approx(45.0)
    a = pipeline_answers(rows).set_index("comparison")
    assert list(a.index[:3]) == ["rlvr-only - distill-rlvr", "rlvr-only - joint", "distill-rlvr - joint"]
    assert a.loc["rlvr-only - distill-rlvr", "verdict"] == NOT_REPRODUCED  # distillation first ends higher
    assert a.loc["rlvr-only - joint", "verdict"] == NOT_REPRODUCED
    assert a.loc["distill-rlvr - joint", "verdict"] in (INCONCLUSIVE, NOT_REPRODUCED)
    assert a.loc["rlvr-only - distill-rlvr", "value"] == pytest.approx(-15.0)
    assert a.loc["distill-rlvr", "verdict"] == REPRODUCED and a.loc["distill-rlvr", "value"] == pytest.approx(-5.0)
    assert a.loc["rlvr-only", "verdict"] == INCONCLUSIVE  # forgetting of 0 +- noise
    one = pipeline_answers(pipeline_rows(summary({"rlvr-only": 0.3, "joint": 0.4}, {"rlvr-only": 0, "joint": 0},
                                                 seeds=(0,))))
    assert set(one["verdict"]) == {NOT_RUN}
    assert np.isnan(one["value"]).all()


def test_tiny_pipelines_run_at_matched_compute_and_report_their_answers(tiny_models, tmp_path, repo_root):
    from kdlab.study.runner import run_study

    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    params = repo_root / "params" / "tiny-pipelines.yaml"
    assert run_study(params, outputs, workers=2, overrides={"threads": 1}, progress=False) == 0
    p = load_profile(params)
    study = outputs / "tiny-pipelines"
    runs = {}
    for folder in (study / "rlvr").iterdir():
        runs[folder.name] = json.loads((folder / "metrics.json").read_text())
    assert sorted(runs) == sorted(s.job_id for s in rlvr_starts(p)) and len(runs) == 6
    for job, m in runs.items():
        steps = p.rlvr.steps if m["pipeline"] == "distill-rlvr" else matched_steps(p)
        assert m["steps_done"] == m["grpo_steps"] == steps, job
        assert m["kl_reference"] == ("teacher" if m["pipeline"] == "joint" else "start")
        assert m["forgetting"] == pytest.approx(m["probe_mean"] - m["base_probe_mean"])
    hist = json.loads((study / "rlvr" / "joint_s0" / "history.json").read_text())
    assert hist[0]["kl"] > 0  # the base is not the teacher
    answers = pd.read_csv(study / "analysis" / "91_rlvr" / "pipelines_answers.csv")
    assert len(answers) == 3 + 3 and set(answers["verdict"]) <= {REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE}
    assert "How distillation and RLVR combine" in (study / "report.html").read_text()
