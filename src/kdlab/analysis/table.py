"""The study's results table as the analysis notebooks read it, and where they write.

The runner writes ``outputs/<study>/results.parquet``: one row per run with at least task,
policy ("off" / "on" / "lambda"), lam, kl, lr, seed, dtype, grad_clip, accuracy, base_accuracy,
pass_at_1, pass_at_10, forgetting, sparsity, collapsed, wall_s, ``probe_<skill>`` and
``forgetting_<skill>`` per probe, and ``<variant>_accuracy`` for harder variants.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

REQUIRED = ("task", "policy", "kl", "lr", "seed")
POLICY_LAMBDA = {"off": -1.0, "on": 1.0}
FACTORS = ("task", "policy", "lam", "kl", "lr", "seed", "dtype", "grad_clip")
# Columns that end in "_accuracy" but are not harder-variant accuracies.
_NOT_VARIANTS = {"accuracy", "base_accuracy"}
# Settings every run records (kdlab.study.runs.training_details): not outcomes.
TRAINING_DETAILS = ("teacher_sample_temperature", "student_sample_temperature", "teacher_loss_temperature",
                    "student_loss_temperature", "warmup", "prompts_per_step")


def repo_root(start: Path | None = None) -> Path:
    """The repository root: the nearest folder at or above ``start`` (default: this file) holding
    ``pyproject.toml``; the current directory when there is none."""
    here = (start or Path(__file__)).resolve()
    for folder in [here, *here.parents]:
        if (folder / "pyproject.toml").exists():
            return folder
    return Path.cwd()


def resolve_path(path: str | Path) -> Path:
    """An absolute path for a path given to a notebook, which may run from ``notebooks/`` or from
    the repository root: as given when absolute or existing from the current directory, else the
    first that exists of ``<root>/notebooks/<path>`` and ``<root>/<path>``, else ``<root>/<path>``."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    root = repo_root()
    for base in (root / "notebooks", root):
        if (base / p).exists():
            return (base / p).resolve()
    return (root / p).resolve()


def notebook_out_dir(study_dir: str | Path, notebook: str, out_dir: str | Path = "") -> Path:
    """Where an analysis notebook writes: ``out_dir`` when given, else
    ``<study_dir>/analysis/<notebook>``. Created if missing."""
    folder = resolve_path(out_dir) if str(out_dir) else resolve_path(study_dir) / "analysis" / notebook
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def prepare_results(df: pd.DataFrame) -> pd.DataFrame:
    """Validate and normalise a results table (a copy).

    * the columns of ``REQUIRED`` must be present (ValueError naming the missing ones);
    * ``lam`` is filled from the policy where missing (off -> -1, on -> +1); lambda runs must
      carry their own lam;
    * ``collapsed`` becomes bool (missing -> False); ``lr`` float.
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"results table lacks required columns {missing}; it has {sorted(df.columns)}")
    out = df.copy()
    bad = sorted(set(out["policy"].dropna().astype(str)) - {"off", "on", "lambda"})
    if bad:
        raise ValueError(f"policy values must be 'off', 'on' or 'lambda', got {bad}")
    implied = out["policy"].map(POLICY_LAMBDA)
    if "lam" not in out.columns:
        out["lam"] = implied
    else:
        out["lam"] = pd.to_numeric(out["lam"], errors="coerce").fillna(implied)
    if out["lam"].isna().any():
        rows = out.index[out["lam"].isna()].tolist()[:5]
        raise ValueError(f"lam is missing for lambda-policy rows {rows}")
    out["lr"] = out["lr"].astype(float)
    out["collapsed"] = out["collapsed"].fillna(False).astype(bool) if "collapsed" in out.columns else False
    return out


def load_results(study_dir: str | Path) -> pd.DataFrame:
    """Read ``<study_dir>/results.parquet`` (or a parquet/CSV file path) and :func:`prepare_results` it."""
    path = resolve_path(study_dir)
    if path.is_dir():
        path = path / "results.parquet"
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}; run the study first (make study)")
    df = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    return prepare_results(df)


def variant_columns(df: pd.DataFrame) -> list[str]:
    """Harder-variant accuracy columns (``<variant>_accuracy``, not ``base_*``), sorted."""
    return sorted(c for c in df.columns if c.endswith("_accuracy") and c not in _NOT_VARIANTS
                  and not c.startswith("base_") and pd.api.types.is_numeric_dtype(df[c]))


def probe_columns(df: pd.DataFrame, prefix: str = "forgetting_") -> list[str]:
    """Per-probe columns with ``prefix`` (``forgetting_`` or ``probe_``; ``probe_mean`` excluded)."""
    return sorted(c for c in df.columns if c.startswith(prefix) and c != "probe_mean")


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Numeric outcome columns (everything numeric that is not a factor or a bookkeeping field)."""
    skip = set(FACTORS) | {"steps", "batch_size", "temperature", "collapse_step", "steps_done", "lr_run", "grid_lr",
                           *TRAINING_DETAILS}
    return [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])
            and not pd.api.types.is_bool_dtype(df[c])]


def main_grid(df: pd.DataFrame) -> pd.DataFrame:
    """The off/on x forward/reverse grid with gradient clipping on (the robustness runs without
    clipping, and sampled-estimator or JSD runs, are left out)."""
    keep = df["policy"].isin(["off", "on"]) & df["kl"].isin(["forward", "reverse"])
    if "grad_clip" in df.columns:
        keep &= df["grad_clip"].notna()
    return df[keep]


def lr_levels(df: pd.DataFrame) -> tuple[float, float] | None:
    """(low, high) learning rate of a table: its smallest and largest lr; None with < 2 values."""
    lrs = np.sort(df["lr"].dropna().unique())
    return (float(lrs[0]), float(lrs[-1])) if lrs.size >= 2 else None
