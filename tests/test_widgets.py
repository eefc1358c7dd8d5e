"""Tests for kdlab.widgets, driven headless (``.value = ...``, ``.click()``), and notebooks 40 / 80."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kdlab.analysis import explore, toy
from kdlab.analysis.synthetic import synthetic_results
from kdlab.analysis.table import prepare_results
from kdlab.widgets import ResultsExplorer, TeachingKLWidget

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def teaching() -> TeachingKLWidget:
    return TeachingKLWidget(steps=150)


def test_teaching_widget_initial_scene_shows_mode_seeking(teaching):
    s = teaching.scene.summary()
    assert s["reverse_top_mode_mass"] > 0.8  # reverse KL: one mode
    assert s["forward_top_mode_mass"] < 0.7  # forward KL: both modes
    assert teaching.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "reverse KL student" in teaching.readout.value
    # The widget's scene is the plain function's scene for the same parameters.
    ref = toy.teaching_scene(**teaching.params())
    np.testing.assert_allclose(teaching.scene.fits["reverse"].probs, ref.fits["reverse"].probs)


def test_teaching_widget_reacts_to_sliders_and_buttons(teaching):
    png, teacher = teaching.image.value, teaching.scene.teacher.copy()
    teaching.positions[1].value = 12.0
    assert teaching.image.value != png
    assert not np.allclose(teaching.scene.teacher, teacher)
    assert toy.mode_masses(teaching.scene.teacher, teaching.scene.support, [5.0, 12.0])[1] == pytest.approx(0.45, abs=1e-3)

    start = teaching.start.value
    teaching.random_start.click()
    assert teaching.start.value != start
    assert teaching.scene.start.argmax() == int(round(teaching.start.value))

    teaching.grad_at.value = "reverse"
    g = toy.kl_gradients(teaching.scene.fits["reverse"].probs, teaching.scene.teacher)
    np.testing.assert_allclose(teaching.scene.grads["forward"], g["forward"], atol=1e-12)

    teaching.start.value = 7.0
    teaching.family.value = "free"
    assert max(f.losses[-1] for f in teaching.scene.fits.values()) < 0.01  # a strong student matches both ways
    teaching.space.value = True
    assert teaching.scene.continuous and len(teaching.scene.support) > 100


def test_teaching_widget_bad_setting_shows_an_error_and_keeps_the_figure():
    w = TeachingKLWidget(steps=20, modes=((5.0, 1.0, 1.0),))
    png = w.image.value
    w.weights[0].value = 0.0
    assert "cannot fit" in w.readout.value and "weight" in w.readout.value
    assert w.image.value == png
    with pytest.raises(ValueError, match="vocab_size"):
        TeachingKLWidget(vocab_size=2)


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return prepare_results(synthetic_results())


def test_results_explorer_follows_its_controls(results):
    w = ResultsExplorer(results)
    assert w.metric.value == "accuracy" and w.x.value == "lam" and w.hue.value == "kl"
    n_all = int(w.data["n"].sum())
    png = w.image.value
    w.filters["lr"].value = (1e-4,)
    assert int(w.data["n"].sum()) == n_all // 2
    assert w.image.value != png and "lr in [0.0001]" in w.summary.value
    w.metric.value = "forgetting"
    expected = explore.explorer_data(results, "forgetting", "lam", "kl", {"lr": [1e-4]})
    pd.testing.assert_frame_equal(w.data.reset_index(drop=True), expected)
    w.hue.value = None
    w.x.value = "lr"
    assert list(w.data.columns[:1]) == ["lr"] and len(w.data) == 1
    w.filters["lr"].value = ()
    assert len(w.data) == 2
    with pytest.raises(ValueError, match="non-empty"):
        ResultsExplorer(results.iloc[:0])


# -------------------------------------------------------------------------------- notebooks (papermill)


def _run(name: str, tmp_path: Path, **parameters) -> None:
    """Execute notebooks/<name>.ipynb with papermill (kernel python3), output notebook in tmp_path."""
    import papermill as pm

    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "src"), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    pm.execute_notebook(str(REPO_ROOT / "notebooks" / f"{name}.ipynb"), str(tmp_path / f"{name}.out.ipynb"),
                        parameters=parameters, kernel_name="python3", cwd=str(REPO_ROOT / "notebooks"),
                        progress_bar=False)


@pytest.mark.slow
def test_notebook_40_teaching_kl(tmp_path):
    _run("40_teaching_kl", tmp_path, study_dir=str(tmp_path / "study"), steps=150)
    out = tmp_path / "study" / "analysis" / "40_teaching_kl"
    res = json.loads((out / "teaching_kl.json").read_text())
    assert res["bimodal_tokens"]["reverse_top_mode_mass"] > 0.8
    assert res["bimodal_tokens"]["forward_top_mode_mass"] < 0.7
    assert res["gradient_check"]["forward"]["max_abs_diff"] < 1e-10
    assert res["gradient_check"]["reverse"]["max_abs_diff"] < 1e-10
    assert res["gradient_check"]["forward"]["max_abs_entry"] <= 1
    for png in ("bimodal_tokens", "bimodal_continuous", "bimodal_free_student"):
        assert (out / f"{png}.png").stat().st_size > 10_000
    starts = pd.read_csv(out / "starts.csv")
    assert starts.query("direction == 'reverse'")["top_mode"].nunique() == 2  # the start decides the mode


@pytest.mark.slow
def test_notebook_80_explorer(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    df = synthetic_results()
    df.to_parquet(study / "results.parquet")
    _run("80_explorer", tmp_path, study_dir=str(study), metric="sparsity", x="lr", hue="policy",
         filters={"kl": ["forward"]})
    out = study / "analysis" / "80_explorer"
    got = pd.read_csv(out / "explorer_data.csv")
    ref = df[df.kl == "forward"].groupby(["lr", "policy"])["sparsity"].mean().reset_index()
    np.testing.assert_allclose(got.sort_values(["lr", "policy"])["mean"], ref.sort_values(["lr", "policy"])["sparsity"])
    assert (out / "explorer.png").stat().st_size > 10_000


@pytest.mark.parametrize("make", [lambda: TeachingKLWidget(steps=50),
                                  lambda: ResultsExplorer(prepare_results(synthetic_results(seeds=(0, 1))))],
                         ids=["teaching", "explorer"])
def test_widgets_carry_a_static_figure_and_no_repr(make):
    w = make()
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # JupyterLab renders the live widget
    assert '<img src="data:image/png;base64,' in bundle["text/html"]
    assert "interactive in JupyterLab" in bundle["text/html"]
    for text in bundle.values():
        assert "children=" not in str(text) and "Widget(" not in str(text)
