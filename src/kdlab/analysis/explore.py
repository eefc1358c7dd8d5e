"""The results explorer's plain functions: filter the table, aggregate, draw one seaborn figure."""
from __future__ import annotations

import pandas as pd

from .spectrum import mean_ci


def figure_png(fig, dpi: int | None = None) -> bytes:
    """PNG bytes of a matplotlib figure."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _check_column(df: pd.DataFrame, name: str, what: str) -> None:
    if name not in df.columns:
        raise ValueError(f"{what} {name!r} is not a column of the results table; columns: {sorted(df.columns)}")


def apply_filters(df: pd.DataFrame, filters: dict[str, list] | None) -> pd.DataFrame:
    """Rows whose value of each filtered column is among the allowed values.

    ``filters`` maps a column to the allowed values; a missing or empty list means no filter on
    that column.
    """
    out = df
    for col, allowed in (filters or {}).items():
        _check_column(df, col, "filter column")
        if allowed is None or len(allowed) == 0:
            continue
        out = out[out[col].isin(list(allowed))]
    return out


def explorer_data(df: pd.DataFrame, metric: str, x: str, hue: str | None = None,
                  filters: dict[str, list] | None = None) -> pd.DataFrame:
    """The numbers behind :func:`explorer_plot`: per (x, hue) value the n runs, mean, SD and 95% CI."""
    _check_column(df, metric, "metric")
    if not pd.api.types.is_numeric_dtype(df[metric]):
        raise ValueError(f"metric {metric!r} must be numeric, got dtype {df[metric].dtype}")
    _check_column(df, x, "x")
    if hue is not None:
        _check_column(df, hue, "hue")
    d = apply_filters(df, filters)
    keys = [x] if hue is None or hue == x else [x, hue]
    rows = [{**dict(zip(keys, k if isinstance(k, tuple) else (k,))), **mean_ci(g[metric])}
            for k, g in d.groupby(keys, sort=True)]
    return pd.DataFrame(rows, columns=[*keys, "n", "mean", "sd", "ci_lo", "ci_hi"])


def explorer_plot(df: pd.DataFrame, metric: str, x: str, hue: str | None = None,
                  filters: dict[str, list] | None = None, dpi: int = 90):
    """A seaborn point plot of ``metric`` against ``x``, one colour per ``hue`` value, with every run
    as a faint dot. Error bars: seaborn's bootstrap 95% CI of the mean (seed 0, so the picture is
    reproducible); :func:`explorer_data` gives the Student-t intervals. Returns a matplotlib Figure."""
    import seaborn as sns
    from matplotlib.figure import Figure

    table = explorer_data(df, metric, x, hue, filters)  # validates the arguments
    d = apply_filters(df, filters).dropna(subset=[metric])
    fig = Figure(figsize=(7.5, 4.2), dpi=dpi, layout="constrained")
    ax = fig.subplots()
    if d.empty:
        ax.text(0.5, 0.5, "no runs match the filters", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    order = sorted(d[x].unique(), key=lambda v: (str(type(v)), v))
    h = hue if hue is not None and hue != x else None
    hue_order = sorted(d[h].unique(), key=lambda v: (str(type(v)), v)) if h else None
    plot = d.assign(**{x: d[x].astype(str)})
    if h:
        plot = plot.assign(**{h: plot[h].astype(str)})
    str_order = [str(v) for v in order]
    str_hue = [str(v) for v in hue_order] if hue_order else None
    dodge = bool(h) and len(hue_order) > 1  # seaborn divides by (hue levels - 1) when dodging
    sns.stripplot(data=plot, x=x, y=metric, hue=h, order=str_order, hue_order=str_hue, dodge=dodge, alpha=0.3,
                  size=3, ax=ax, legend=False)
    sns.pointplot(data=plot, x=x, y=metric, hue=h, order=str_order, hue_order=str_hue, dodge=0.3 if dodge else False,
                  errorbar=("ci", 95), seed=0, ax=ax)
    ax.set_title(f"{metric} by {x}" + (f" and {h}" if h else "") + f"  ({len(d)} runs, {len(table)} groups)",
                 fontsize=10)
    return fig
