"""Interactive widgets (ipywidgets) for the analysis notebooks.

Each widget is a ``VBox`` of controls over an ``Image`` holding a PNG rendered with matplotlib's
Agg backend, plus an ``HTML`` readout. Every callback only gathers the control values and calls
a plain function of ``kdlab.analysis`` (``teaching_scene`` / ``teaching_figure``,
``explorer_data`` / ``explorer_plot``), so the widgets can be driven headless in tests by setting
``.value`` or calling ``.click()`` on the controls.

Displayed, each widget also carries a static stand-in (``_repr_mimebundle_``): JupyterLab shows
the live widget; a static export (the study's ``report.html``) shows the current figure and a
line saying that it is interactive in JupyterLab, never the widget's Python repr.
"""
from __future__ import annotations

import base64
import html
import random
from typing import Any

import ipywidgets as widgets
import pandas as pd

from .analysis.explore import explorer_data, explorer_plot, figure_png
from .analysis.table import FACTORS, metric_columns
from .analysis.toy import teaching_figure, teaching_scene

def _static_bundle(widget: widgets.Widget, png: bytes | None, readout: str, notebook: str,
                   data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (ipywidgets' bundle) with a static stand-in: an HTML figure (the current PNG, its
    readout and a line saying the figure is interactive in JupyterLab) and a one-line text form
    instead of the widget's repr. JupyterLab renders the widget view (it ranks first); a static
    export (nbconvert, the study's report.html) has no widget state and shows the HTML."""
    img = (f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{html.escape(notebook)} figure" '
           f'style="max-width:100%">' if png else "")
    note = (f"Static figure of the {type(widget).__name__} widget; it is interactive in JupyterLab: open "
            f"notebooks/{notebook}, run it and move the controls.")
    data = dict(data)
    data["text/html"] = (f'<div class="kdlab-static-widget">{img}<div>{readout}</div>'
                         f'<p class="kdlab-interactive-note"><em>{html.escape(note)}</em></p></div>')
    data["text/plain"] = note
    return data


_SLIDER = dict(continuous_update=False, style={"description_width": "initial"},
               layout=widgets.Layout(width="260px"))


class TeachingKLWidget(widgets.VBox):
    """Shape a teacher with up to three bumps; watch forward- and reverse-KL students fit it.

    Controls: per mode ``positions[k]``, ``widths[k]``, ``weights[k]`` (weight 0 removes a mode);
    ``family`` (one-bump student or free logits), ``space`` (tokens or a continuous variable),
    ``start`` (where the student's bump starts), ``steps`` (Adam steps), ``grad_at`` (the student the
    gradient bars are taken at) and the ``random_start`` button (a new random start). ``scene``
    holds the last :class:`kdlab.analysis.toy.TeachingScene`, ``image.value`` its PNG and
    ``readout`` the numbers.
    """

    def __init__(self, vocab_size: int = 20, modes: tuple[tuple[float, float, float], ...] = ((5.0, 1.0, 0.55),
                 (14.0, 1.0, 0.45), (10.0, 1.0, 0.0)), steps: int = 300, lr: float = 0.1, start: float = 7.0,
                 init_width: float = 1.5, seed: int = 0):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 4 <= vocab_size <= 64:
            raise ValueError(f"vocab_size must be an int in [4, 64], got {vocab_size!r}")
        if not 1 <= len(modes) <= 3:
            raise ValueError(f"modes must hold 1 to 3 (position, width, weight) triples, got {len(modes)}")
        self.vocab_size, self.lr, self.init_width = vocab_size, lr, init_width
        self._rng = random.Random(seed)
        top = float(vocab_size - 1)
        self.positions = [widgets.FloatSlider(value=c, min=0.0, max=top, step=0.5, description=f"mode {k + 1} position",
                                              **_SLIDER) for k, (c, _, _) in enumerate(modes)]
        self.widths = [widgets.FloatSlider(value=s, min=0.3, max=4.0, step=0.1, description=f"mode {k + 1} width",
                                           **_SLIDER) for k, (_, s, _) in enumerate(modes)]
        self.weights = [widgets.FloatSlider(value=w, min=0.0, max=1.0, step=0.05, description=f"mode {k + 1} weight",
                                            **_SLIDER) for k, (_, _, w) in enumerate(modes)]
        self.family = widgets.Dropdown(options=[("one bump (weak student)", "gaussian"),
                                                ("free logits (strong student)", "free")],
                                       value="gaussian", description="student")
        self.space = widgets.ToggleButtons(options=[("tokens", False), ("continuous", True)], value=False,
                                           description="support")
        self.start = widgets.FloatSlider(value=start, min=0.0, max=top, step=0.5, description="student start", **_SLIDER)
        self.steps = widgets.IntSlider(value=steps, min=0, max=1000, step=25, description="Adam steps", **_SLIDER)
        self.grad_at = widgets.Dropdown(options=[("initial student", "start"), ("forward-KL fit", "forward"),
                                                 ("reverse-KL fit", "reverse")], value="start",
                                        description="gradients at")
        self.random_start = widgets.Button(description="random start", icon="random")
        self.image = widgets.Image(format="png")
        self.readout = widgets.HTML()
        self.scene = None
        for w in [*self.positions, *self.widths, *self.weights, self.family, self.space, self.start, self.steps,
                  self.grad_at]:
            w.observe(self._on_change, names="value")
        self.random_start.on_click(self._on_random_start)
        modes_box = widgets.HBox([widgets.VBox([p, s, w]) for p, s, w in zip(self.positions, self.widths, self.weights)])
        student_box = widgets.HBox([widgets.VBox([self.family, self.space]),
                                    widgets.VBox([self.start, self.steps]),
                                    widgets.VBox([self.grad_at, self.random_start])])
        super().__init__([modes_box, student_box, self.image, self.readout])
        self.update()

    def params(self) -> dict[str, Any]:
        """The control values as keyword arguments of ``kdlab.analysis.toy.teaching_scene``."""
        return {"centers": [w.value for w in self.positions], "widths": [w.value for w in self.widths],
                "weights": [w.value for w in self.weights], "vocab_size": self.vocab_size,
                "continuous": bool(self.space.value), "family": self.family.value, "steps": int(self.steps.value),
                "lr": self.lr, "init_mean": float(self.start.value), "init_width": self.init_width,
                "grad_at": self.grad_at.value}

    def update(self) -> None:
        """Recompute the scene from the controls and redraw (a bad setting shows its error)."""

        try:
            scene = teaching_scene(**self.params())
        except ValueError as exc:
            self.readout.value = f"<b style='color:#b00'>cannot fit: {html.escape(str(exc))}</b>"
            return
        self.scene = scene
        self.image.value = figure_png(teaching_figure(scene))
        s = scene.summary()
        self.readout.value = (
            f"<span class='kdlab-readout'>forward KL student: KL {s['forward_kl']:.3f} nats, "
            f"{s['forward_top_mode_mass']:.0%} of its mass on mode {s['forward_top_mode'] + 1} &nbsp;|&nbsp; "
            f"reverse KL student: KL {s['reverse_kl']:.3f} nats, {s['reverse_top_mode_mass']:.0%} on mode "
            f"{s['reverse_top_mode'] + 1} &nbsp;|&nbsp; at the {scene.grad_at} student: max |forward grad| "
            f"{s['max_abs_forward_grad']:.3f} (always <= 1), max |reverse grad| {s['max_abs_reverse_grad']:.3f}</span>")

    def _on_change(self, change: dict) -> None:
        self.update()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return _static_bundle(self, self.image.value, self.readout.value, "40_teaching_kl.ipynb",
                              super()._repr_mimebundle_(**kwargs))

    def _on_random_start(self, button: widgets.Button) -> None:
        top = self.vocab_size - 1
        self.start.value = round(self._rng.uniform(0, top) * 2) / 2  # triggers update via observe


def _plain(v: Any) -> Any:
    """numpy scalars -> Python scalars (widget options must be JSON-friendly)."""
    return v.item() if hasattr(v, "item") else v


class ResultsExplorer(widgets.VBox):
    """Explore a results table: pick a metric, the x factor, a hue and filters; the figure follows.

    Controls: ``metric``, ``x``, ``hue`` dropdowns and one ``filters[column]`` SelectMultiple per
    factor with several values (nothing selected = no filter). ``data`` holds the aggregated
    numbers of the current figure (:func:`kdlab.analysis.explore.explorer_data`), ``image.value``
    its PNG.
    """

    def __init__(self, df: pd.DataFrame, metric: str = "accuracy", x: str = "lam", hue: str | None = "kl"):
        if not isinstance(df, pd.DataFrame) or df.empty:
            raise ValueError("df must be a non-empty results DataFrame")
        self.df = df
        metrics = metric_columns(df)
        if not metrics:
            raise ValueError(f"the results table has no numeric metric column; columns: {sorted(df.columns)}")
        factors = [f for f in FACTORS if f in df.columns and df[f].nunique() >= 1]
        self.metric = widgets.Dropdown(options=metrics, value=metric if metric in metrics else metrics[0],
                                       description="metric")
        self.x = widgets.Dropdown(options=factors, value=x if x in factors else factors[0], description="x")
        self.hue = widgets.Dropdown(options=[("(none)", None)] + [(f, f) for f in factors],
                                    value=hue if hue in factors else None, description="hue")
        self.filters: dict[str, widgets.SelectMultiple] = {}
        for f in factors:
            values = sorted(df[f].dropna().unique(), key=lambda v: (str(type(v)), v))
            if len(values) >= 2 and f != "seed":
                self.filters[f] = widgets.SelectMultiple(options=[(str(_plain(v)), _plain(v)) for v in values],
                                                         value=(), description=f, rows=min(len(values), 5),
                                                         layout=widgets.Layout(width="200px"))
        self.image = widgets.Image(format="png")
        self.summary = widgets.HTML()
        self.data: pd.DataFrame | None = None
        for w in [self.metric, self.x, self.hue, *self.filters.values()]:
            w.observe(self._on_change, names="value")
        controls = widgets.HBox([widgets.VBox([self.metric, self.x, self.hue]),
                                 widgets.HBox(list(self.filters.values()))])
        super().__init__([controls, self.image, self.summary])
        self.update()

    def selection(self) -> dict[str, Any]:
        """The control values as keyword arguments of ``explorer_plot``."""
        return {"metric": self.metric.value, "x": self.x.value, "hue": self.hue.value,
                "filters": {c: list(w.value) for c, w in self.filters.items() if w.value}}

    def update(self) -> None:

        sel = self.selection()
        try:
            self.data = explorer_data(self.df, **sel)
            self.image.value = figure_png(explorer_plot(self.df, **sel))
        except ValueError as exc:
            self.summary.value = f"<b style='color:#b00'>{html.escape(str(exc))}</b>"
            return
        n = int(self.data["n"].sum()) if len(self.data) else 0
        filt = ", ".join(f"{k} in {v}" for k, v in sel["filters"].items()) or "none"
        self.summary.value = (f"<span class='kdlab-readout'>{html.escape(sel['metric'])}: {n} runs in "
                              f"{len(self.data)} groups; filters: {html.escape(filt)}</span>")

    def _on_change(self, change: dict) -> None:
        self.update()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return _static_bundle(self, self.image.value, self.summary.value, "80_explorer.ipynb",
                              super()._repr_mimebundle_(**kwargs))
