"""The report (30) and statistics (70) notebooks on every grid shape the profile validator accepts.

Each shape is a synthetic results table (``kdlab.analysis.synthetic``: two tasks, three seeds,
both policies and KLs, two rates, one lambda run) cut down to one policy, one KL (forward, or
jsd: no forward/reverse grid at all), one rate, one seed, one task, one policy and KL, or one of
everything, written as a study's ``results.parquet``; both notebooks run on it in one warm
kernel and must finish without an error.
"""
from __future__ import annotations

import pytest

from kdlab.analysis.synthetic import synthetic_results
from kdlab.study.kernels import WarmKernel, _execute_safely, _kernel_env
from kdlab.study.plan import REPORT_NB, _notebook
from test_study import ensure_kernel

SHAPES = {
    "one policy": lambda d: d[d.policy == "off"],
    "one kl": lambda d: d[d.kl == "forward"],
    "one rate": lambda d: d[d.lr == d.lr.min()],
    "one seed": lambda d: d[d.seed == 0],
    "one task": lambda d: d[d.task == "countdown-3"],
    "one policy and kl": lambda d: d[(d.policy == "off") & (d.kl == "forward")],
    "one kl, jsd": lambda d: d[d.kl == "forward"].assign(kl="jsd"),
    "one run": lambda d: d[(d.policy == "off") & (d.kl == "forward") & (d.lr == d.lr.min()) & (d.seed == 0)
                           & (d.task == "countdown-3")],
}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    ensure_kernel()
    k = WarmKernel(0, tmp_path_factory.mktemp("shapes-kernel"), _kernel_env(1))
    k.submit(k.start).result()
    yield k
    k.close()


def _table():
    df = synthetic_results(tasks=("countdown-3", "kb-mc"), lambdas=(0.5,))
    df["run_id"] = [f"{r.task}_{r.policy}{r.lam:+g}_{r.kl}_lr{r.lr:g}_s{r.seed}" for r in df.itertuples()]
    return df


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("notebook", [REPORT_NB, "70_statistics.ipynb"])
def test_report_notebooks_run_on_every_grid_shape(kernel, tmp_path, shape, notebook):
    study = tmp_path / "study"
    study.mkdir()
    table = SHAPES[shape](_table()).reset_index(drop=True)
    assert len(table) >= 1
    table.to_parquet(study / "results.parquet", index=False)
    out = study / notebook
    outcome = kernel.submit(_execute_safely, kernel, _notebook(notebook), out, {"study_dir": str(study)},
                            study).result()
    assert outcome.error is None, f"{notebook} on {shape}: {outcome.error['ename']}: {outcome.error['evalue']}"
