"""The teachers and students axes (issue 42): profile keys and their refusals, teacher checkpoints
(``until``), the points as studies, and the answer lines on constructed results tables."""
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from kdlab.analysis.axes import (OWN, decide_differs, point_rows, point_table, student_answers, teacher_answers)
from kdlab.analysis.findings import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Estimate
from kdlab.core.fields import ConfigError
from kdlab.models.store import model_key
from kdlab.models.toy import load_checkpoint
from kdlab.study.config import axis_points, axis_profiles, load_profile
from kdlab.study.plan import AXES_NB, analysis_notebooks, expand_grid
from kdlab.study.teachers import ModelStore

from test_study import outputs_with_models, tiny_models  # noqa: F401 (session fixture)
from test_teachers import PRE, SPEC, mixture


def write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = "extends: {repo}/params/quick.yaml\ngrid: {{tasks: [countdown-3], low_rate_only: true}}\n"


def profile(tmp_path, repo_root, text):
    return load_profile(write(tmp_path, BASE.format(repo=repo_root) + text))


@pytest.mark.parametrize("text, needle", [
    ("axes: {teachers: []}\n", "axes.teachers: the list is empty"),
    ("axes: {students: []}\n", "axes.students: the list is empty"),
    ("axes: {teachers: [{size: teacher-xxl}]}\n", "axes.teachers[0].size: 'teacher-xxl' is not a valid choice"),
    ("axes: {students: [{size: nano}, {size: student-xl}]}\n", "axes.students[1].size: 'student-xl' is not a valid"),
    ("axes: {students: [{}]}\n", "axes.students[0].size: '' is not a valid choice"),
    ("axes: {teachers: [{checkpoint: 9000}]}\n",
     "axes.teachers[0].checkpoint: step 9000 is past the teacher's training of countdown-3 (8000 steps"),
    ("axes: {teachers: [{checkpoint: 1000}, {checkpoint: 1000}]}\n", "'step1000' is listed twice"),
    ("axes: {teachers: [{size: teacher-xs}]}\n", "a point equal to the profile's own teacher"),
    ("axes: {students: [{size: student-s}]}\n", "a point equal to the profile's own student"),
    ("axes: {students: [{path: /models/x}]}\n", "a path is for a pretrained profile"),
    ("axes: {teachers: [{chekpoint: 3}]}\n", "unknown key 'axes.teachers[0].chekpoint'"),
    ("axes: {teachers: [{arithmetic: fp16}]}\n", "axes.teachers[0].arithmetic: 'fp16' is not a valid choice"),
    ("axes: {teachers: [{arithmetic: bf16}]}\n", "a point equal to the profile's own teacher"),
    ("axes: {students: [{size: student-s, arithmetic: bf16}]}\n", "a point equal to the profile's own student"),
    ("axes: {students: [{size: student-s, steps: 3000, lr: 0.002}]}\n", "a point equal to the profile's own student"),
    ("axes: {students: [{size: nano, steps: -1}]}\n", "axes.students[0].steps"),
    ("axes: {students: [{size: nano, lr: 2}]}\n", "axes.students[0].lr"),
    ("teacher_pretrain: {until: 8001}\n", "teacher_pretrain.until: step 8001 is past the training of the teacher of "
                                          "countdown-3 (8000 steps)"),
    ("student_pretrain: {until: 3001}\n", "student_pretrain.until: step 3001 is past the training of the student base"),
])
def test_bad_axis_values_are_refused_by_key(tmp_path, repo_root, text, needle):
    with pytest.raises(ConfigError) as err:
        profile(tmp_path, repo_root, text)
    assert needle in str(err.value)


def test_axis_points_are_studies_of_the_main_grid_at_the_low_rate(tmp_path, repo_root):
    quick = load_profile(repo_root / "params" / "quick.yaml")
    p = profile(tmp_path, repo_root, "axes: {teachers: [{checkpoint: 1000}, {size: teacher-s}], "
                                     "students: [{size: nano}, {size: student-m}]}\n")
    low = quick.grid.task_lrs["countdown-3"][0]
    assert p.grid.lrs == quick.grid.lrs[:1] and p.grid.task_lrs["countdown-3"] == [low]
    assert {c.lr for c in expand_grid(p)} == {low} and len(expand_grid(p)) == 4 * len(quick.grid.seeds)
    got = {pt.suffix: pt.overrides for pt in axis_points(p)}
    assert got == {"teachers-step1000": {"teacher_pretrain": {"until": 1000}},
                   "teachers-teacher-s": {"teacher": {"size": "teacher-s"}},
                   "students-nano": {"student": {"size": "nano"}},
                   "students-student-m": {"student": {"size": "student-m"}}}
    studies = {pt.suffix: q for pt, q in axis_profiles(p)}
    assert studies["teachers-step1000"].name == "quick-teachers-step1000"
    for q in studies.values():
        assert expand_grid(q) == expand_grid(p)  # the same cells: only the model changes
        assert not (q.axes.teachers or q.axes.students or q.companions or q.rlvr.enabled or q.style.enabled)
    assert studies["teachers-step1000"].teacher_pretrain.until == 1000
    assert studies["students-nano"].student.size == "nano" and studies["students-nano"].teacher == p.teacher
    assert AXES_NB in analysis_notebooks(p) and AXES_NB not in analysis_notebooks(quick)


def test_a_point_may_name_its_pretraining_arithmetic(tmp_path, repo_root):
    """``arithmetic`` on a point overrides the profile's pretraining arithmetic for that model only
    (its own model key, its own label); the profile's own models keep theirs."""
    p = profile(tmp_path, repo_root, "axes: {teachers: [{checkpoint: 1000, arithmetic: fp32}, {arithmetic: fp32}], "
                                     "students: [{size: nano, arithmetic: fp32}, {size: student-s, arithmetic: fp32}]}\n")
    got = {pt.suffix: pt.overrides for pt in axis_points(p)}
    assert got == {"teachers-step1000-fp32": {"teacher_pretrain": {"until": 1000, "arithmetic": "fp32"}},
                   "teachers-fp32": {"teacher_pretrain": {"arithmetic": "fp32"}},
                   "students-nano-fp32": {"student": {"size": "nano"}, "student_pretrain": {"arithmetic": "fp32"}},
                   "students-fp32": {"student_pretrain": {"arithmetic": "fp32"}}}
    studies = {pt.suffix: q for pt, q in axis_profiles(p)}
    assert studies["teachers-step1000-fp32"].teacher_pretrain.arithmetic == "fp32"
    assert studies["teachers-step1000-fp32"].student_pretrain == p.student_pretrain  # the student base is shared
    assert studies["students-nano-fp32"].teacher_pretrain == p.teacher_pretrain
    assert p.teacher_pretrain.arithmetic == p.student_pretrain.arithmetic == "bf16"
    # the fp32 checkpoint is a model of its own, not the bf16 one
    fp32 = studies["teachers-step1000-fp32"]
    keys = {model_key("teacher", q.teacher, q.teacher_pretrain, [], q.trace)["pretrain"].get("arithmetic")
            for q in (p, fp32)}
    assert keys == {None, "fp32"}


def test_a_student_point_may_name_its_own_pretraining_recipe(tmp_path, repo_root):
    """``steps`` / ``lr`` on a student point override student_pretrain's for that base only: a model
    of its own (its key), a label naming them, the profile's own base and the teacher unchanged."""
    p = profile(tmp_path, repo_root, "axes: {students: [{size: student-m, arithmetic: fp32, lr: 0.001}, "
                                     "{size: nano, arithmetic: fp32, steps: 9000}, {size: student-s, lr: 0.004}]}\n")
    got = {pt.suffix: pt.overrides for pt in axis_points(p)}
    assert got == {"students-student-m-fp32-lr0.001": {"student": {"size": "student-m"},
                                                         "student_pretrain": {"arithmetic": "fp32", "lr": 0.001}},
                   "students-nano-fp32-steps9000": {"student": {"size": "nano"},
                                                     "student_pretrain": {"arithmetic": "fp32", "steps": 9000}},
                   "students-lr0.004": {"student_pretrain": {"lr": 0.004}}}
    studies = {pt.suffix: q for pt, q in axis_profiles(p)}
    m = studies["students-student-m-fp32-lr0.001"]
    assert (m.student_pretrain.lr, m.student_pretrain.steps) == (0.001, p.student_pretrain.steps)
    assert studies["students-nano-fp32-steps9000"].student_pretrain.steps == 9000
    assert m.teacher_pretrain == p.teacher_pretrain and p.student_pretrain.lr == 2e-3
    keys = {model_key("student", q.student, q.student_pretrain, [], q.trace)["pretrain"]["lr"] for q in (p, m)}
    assert keys == {2e-3, 1e-3}


def test_a_pretrained_profile_takes_checkpoint_paths_as_points(tmp_path, repo_root):
    real = ("name: r\npretrained:\n  student: /m/student\n  probes: true\n"
            "  tasks: [{name: countdown-3, kind: countdown, teacher: /m/teacher}]\n"
            "grid: {tasks: [countdown-3]}\n")
    p = load_profile(write(tmp_path, real + "axes: {teachers: [{path: /m/teacher-big}], students: [{path: /m/s2/}]}\n"))
    pts = {pt.suffix: pt.overrides for pt in axis_points(p)}
    assert pts["students-s2"] == {"pretrained": {"student": "/m/s2/"}}
    assert [t["teacher"] for t in pts["teachers-teacher-big"]["pretrained"]["tasks"]] == ["/m/teacher-big"]
    for bad, needle in (("axes: {teachers: [{size: teacher-s}]}\n", "give its path"),
                        ("axes: {students: [{path: /m/student}]}\n", "a point equal to the profile's own student"),
                        ("axes: {students: [{path: /m/s2, arithmetic: fp32}]}\n", "give its path"),
                        ("axes: {students: [{path: /m/s2, lr: 0.001}]}\n", "give its path")):
        with pytest.raises(ConfigError) as err:
            load_profile(write(tmp_path, real + bad))
        assert needle in str(err.value)


def test_a_teacher_checkpoint_is_the_training_stopped_at_that_step(tmp_path, monkeypatch):
    """``until`` 4 of a 6-step schedule = the state an uninterrupted 6-step training passes at step N
    (read from its resumable checkpoint), not a 4-step training (whose schedule decays sooner);
    ``until`` enters the model key only when set."""
    import kdlab.study.teachers as teachers

    stopped = replace(PRE, until=4)
    key = model_key("teacher-x", SPEC, stopped, mixture(), "steps")
    assert key["pretrain"]["until"] == 4 and "until" not in model_key("teacher-x", SPEC, PRE, mixture(), "steps")["pretrain"]
    at4 = ModelStore(tmp_path / "a", shipped_dir=None).get_or_train("teacher-x", key, SPEC, stopped, mixture(),
                                                                      progress=False, checkpoint_every=4)
    short = ModelStore(tmp_path / "b", shipped_dir=None).get_or_train(
        "teacher-x", {"k": 4}, SPEC, replace(PRE, steps=4), mixture(), progress=False, checkpoint_every=4)
    monkeypatch.setattr(teachers, "save_checkpoint", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    store = ModelStore(tmp_path / "c", shipped_dir=None)
    with pytest.raises(KeyboardInterrupt):  # the full training, stopped before its final save
        store.get_or_train("teacher-x", {"k": 6}, SPEC, PRE, mixture(), progress=False, checkpoint_every=4)
    partial = store.path("teacher-x", {"k": 6}).with_name(store.path("teacher-x", {"k": 6}).name + ".partial")
    state = torch.load(partial / "state.pt", weights_only=False)
    assert state["step"] == 4
    w4, ws = load_checkpoint(at4).state_dict(), load_checkpoint(short).state_dict()
    assert all(torch.equal(w4[k], state["model"][k].to(torch.bfloat16)) for k in w4)
    assert any(not torch.equal(w4[k], ws[k]) for k in w4)


# ---------------------------------------------------------------------------------------------- answer lines

CONFIGS = [(p, k) for p in ("off", "on") for k in ("forward", "reverse")]


def table(gains, x_col, xs, seeds=(0, 1, 2), noise=0.002, base=0.30):
    """A results table in axis_rows' shape: ``gains[point][(policy, kl)]`` (fractions) per point,
    ``xs[point]`` its teacher accuracy or parameter count; seed noise +-noise."""
    rows = []
    for point, by_conf in gains.items():
        for (policy, kl), g in by_conf.items():
            for s in seeds:
                e = noise * (s - 1)
                rows.append({"task": "countdown-3", "point": point, "policy": policy, "kl": kl, "seed": s,
                             "lr": 1e-4, "accuracy": base + g + e, "base_accuracy": base, "gain": g + e,
                             "forgetting": -0.01, x_col: xs[point]})
    return pd.DataFrame(rows)


def verdicts(lines, claim_word):
    return dict(zip(lines.loc[lines["claim"].str.contains(claim_word), "configuration"],
                    lines.loc[lines["claim"].str.contains(claim_word), "verdict"]))


def test_teacher_answers_see_growth_and_a_capacity_gap_where_they_are_built_in():
    # off/*: gain grows with the teacher; on/forward: the strongest teacher teaches less than the middle one
    gains = {"weak": {c: 0.05 for c in CONFIGS}, "mid": {c: 0.10 for c in CONFIGS},
             OWN: {("off", "forward"): 0.15, ("off", "reverse"): 0.15, ("on", "forward"): 0.06, ("on", "reverse"): 0.10}}
    d = table(gains, "teacher_accuracy", {"weak": 0.4, "mid": 0.6, OWN: 0.75})
    lines = teacher_answers(d)
    assert len(lines) == 8 and set(lines["task"]) == {"countdown-3"}
    grows, gap = verdicts(lines, "grows"), verdicts(lines, "capacity")
    assert grows["off/forward"] == grows["off/reverse"] == REPRODUCED
    assert gap["on/forward"] == REPRODUCED and gap["off/forward"] == NOT_REPRODUCED
    row = lines[(lines["configuration"] == "off/forward") & lines["claim"].str.contains("grows")].iloc[0]
    assert row["value"] == pytest.approx(10.0) and row["ci_low"] < 10 < row["ci_high"]
    assert "gain(own) - gain(weak)" in row["line"]
    # equal gains: neither claim is decided by noise alone
    flat = teacher_answers(table({k: {c: 0.1 for c in CONFIGS} for k in gains}, "teacher_accuracy",
                                 {"weak": 0.4, "mid": 0.6, OWN: 0.75}, noise=0.05))
    assert set(flat.loc[flat["claim"].str.contains("grows"), "verdict"]) == {INCONCLUSIVE}


def test_teacher_answers_are_not_run_without_two_teachers_or_replicates():
    one = table({OWN: {c: 0.1 for c in CONFIGS}}, "teacher_accuracy", {OWN: 0.7})
    assert set(teacher_answers(one)["verdict"]) == {NOT_RUN}
    single = table({"a": {c: 0.1 for c in CONFIGS}, OWN: {c: 0.2 for c in CONFIGS}}, "teacher_accuracy",
                   {"a": 0.5, OWN: 0.7}, seeds=(0,))
    lines = teacher_answers(single)
    assert set(lines["verdict"]) == {NOT_RUN} and lines["note"].str.contains("seeds").all()


def test_student_answers_read_the_change_of_each_gap_with_size():
    # the OnPD - OffPD gap grows from 0 (small) to 8 points (large); the forward - reverse gap stays 2
    def conf(on_off, fwd_rev):
        return {("off", "forward"): 0.10, ("off", "reverse"): 0.10 - fwd_rev,
                ("on", "forward"): 0.10 + on_off, ("on", "reverse"): 0.10 + on_off - fwd_rev}
    gains = {"nano": conf(0.0, 0.02), OWN: conf(0.04, 0.02), "student-m": conf(0.08, 0.02)}
    d = table(gains, "student_params", {"nano": 1e5, OWN: 8e5, "student-m": 1.8e6}, noise=0.002)
    lines = student_answers(d)
    by = dict(zip(lines["configuration"], lines["verdict"]))
    assert by == {"policy": REPRODUCED, "kl": NOT_REPRODUCED}
    row = lines[lines["configuration"] == "policy"].iloc[0]
    assert row["value"] == pytest.approx(8.0) and "gap(student-m) - gap(nano)" in row["line"]


def test_decide_differs_is_two_sided_with_a_no_change_margin():
    assert decide_differs(Estimate(5, 1, 9), 3) == REPRODUCED
    assert decide_differs(Estimate(-5, -9, -1), 3) == REPRODUCED
    assert decide_differs(Estimate(0, -2, 2), 3) == NOT_REPRODUCED
    assert decide_differs(Estimate(1, -2, 4), 3) == INCONCLUSIVE
    assert decide_differs(Estimate(math.nan, math.nan, math.nan), 3) == INCONCLUSIVE


def test_point_rows_keep_the_low_rate_and_read_the_models_table():
    res = pd.DataFrame([{"task": "countdown-3", "policy": p, "kl": "forward", "lr": lr, "seed": 0, "accuracy": 0.5,
                         "base_accuracy": 0.3, "forgetting": 0.0, "grad_clip": 1.0}
                        for p in ("off", "on") for lr in (1e-4, 5e-4)])
    models = [{"model": "teacher", "task": "countdown-3", "accuracy": 0.7, "n_params": 2e6},
              {"model": "student base", "task": "countdown-3", "accuracy": 0.3, "n_params": 8e5}]
    d = point_rows(res, models, "p1")
    assert set(d["lr"]) == {1e-4} and len(d) == 2
    assert (d["teacher_accuracy"] == 0.7).all() and (d["student_params"] == 8e5).all()
    assert np.allclose(d["gain"], 0.2) and set(d["point"]) == {"p1"}
    t = point_table(d, "teachers")
    assert list(t.columns[:5]) == ["task", "point", "policy", "kl", "teacher_accuracy"] and (t["gain"] == 20).all()


# ---------------------------------------------------------------------------------------------- end to end

def test_tiny_axes_study_runs_every_point_and_answers_in_its_report(tiny_models, tmp_path, repo_root):
    """params/tiny-axes.yaml: its own study, a teacher checkpoint and a second student preset, each
    a study of the grid's low-rate cells; section 94_axes reads them and writes the answer lines."""
    import json
    from pathlib import Path

    import nbformat

    from kdlab.study.plan import notebook_finished
    from kdlab.study.runner import run_study

    params = repo_root / "params" / "tiny-axes.yaml"
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    assert run_study(params, outputs, workers=2, overrides={"distill.steps": 2, "threads": 1}, progress=False) == 0
    study = outputs / "tiny-axes"
    points = json.loads((study / "axes.json").read_text())
    assert [(p["axis"], p["label"], p["name"]) for p in points] == [
        ("teachers", "step15", "tiny-axes-teachers-step15"),
        ("students", "student-s-steps40-lr0.002", "tiny-axes-students-student-s-steps40-lr0.002")]
    teachers = {}
    for folder in [study, *(Path(p["study_dir"]) for p in points)]:
        df = pd.read_parquet(folder / "results.parquet")
        assert len(df) == 8 and df["lr"].nunique() == 1  # 4 configurations x 2 seeds at the low rate
        models = json.loads((folder / "models.json").read_text())
        teachers[folder.name] = next(m for m in models if m["model"] == "teacher")
    assert teachers["tiny-axes-teachers-step15"]["path"] != teachers["tiny-axes"]["path"]
    student_s = "tiny-axes-students-student-s-steps40-lr0.002"
    assert teachers[student_s]["path"] == teachers["tiny-axes"]["path"]  # same teacher
    bases = {name: json.loads((Path(next(m for m in json.loads((folder / "models.json").read_text())
                                          if m["model"] == "student base")["path"]) / "kdlab.json").read_text())
             for name, folder in ((n, outputs / n) for n in ("tiny-axes", student_s))}
    assert [(b["key"]["model"]["size"], b["key"]["pretrain"]["steps"], b["key"]["pretrain"]["lr"]) for b in bases.values()] \
        == [("nano", 30, 3e-3), ("student-s", 40, 2e-3)]  # the point's base was built with its own recipe
    nb = study / "analysis" / "94_axes.ipynb"
    assert notebook_finished(nb)
    assert not any(o.output_type == "error" for c in nbformat.read(nb, as_version=4).cells for o in c.get("outputs", []))
    for axis, n in (("teachers", 8), ("students", 2)):
        lines = pd.read_csv(study / "analysis" / "94_axes" / f"{axis}_answers.csv")
        assert len(lines) == n and set(lines["verdict"]) <= {REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE}
        assert (study / "analysis" / "94_axes" / f"{axis}.png").exists()
    assert "Axes: teacher strength and student scale" in (study / "report.html").read_text()
    assert not (Path(points[0]["study_dir"]) / "report.html").exists()  # shown in the axis study's report


def test_the_axes_keys_work_with_a_pretrained_profile(tmp_path):
    """A smoke test on tiny random Hugging Face checkpoints: a second student checkpoint as the
    students axis's point, its own study of the low-rate grid, and section 94_axes reading both."""
    import json

    import yaml
    from transformers import AutoTokenizer

    from kdlab.study.runner import run_study
    from test_study import ensure_kernel
    from tiny_hf import build_checkpoint, write_real_profile

    ensure_kernel()
    path = write_real_profile(tmp_path / "data", "qwen2", name="hf-axes", tasks=["mc"], lambdas=[], seeds=[0, 1],
                              low_rate_only=True)
    data = yaml.safe_load(path.read_text())
    tok = AutoTokenizer.from_pretrained(data["pretrained"]["student"])
    other = build_checkpoint(tmp_path / "data" / "qwen2-student-b", "qwen2", "student", tok, seed=7)
    data["axes"] = {"students": [{"path": str(other)}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert run_study(path, tmp_path / "out", workers=2, progress=False) == 0
    study = tmp_path / "out" / "hf-axes"
    (point,) = json.loads((study / "axes.json").read_text())
    assert point["label"] == "qwen2-student-b" and point["overrides"] == {"pretrained": {"student": str(other)}}
    for folder in (study, tmp_path / "out" / point["name"]):
        df = pd.read_parquet(folder / "results.parquet")
        assert len(df) == 8 and df["lr"].nunique() == 1
    b = pd.read_parquet(tmp_path / "out" / point["name"] / "results.parquet")
    assert set(b["student_path"]) == {str(other)}
    lines = pd.read_csv(study / "analysis" / "94_axes" / "students_answers.csv")
    assert len(lines) == 2 and "size" in lines["claim"].iloc[0]
