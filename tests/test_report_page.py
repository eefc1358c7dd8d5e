"""The study's report as a reader sees it (issue 18): the answer on the first screen, a table of
contents, titled tables, long tables folded, and no noise (IPython history errors, tracebacks,
progress bars, object or widget reprs, warnings) in report.html or any executed notebook.

The end-to-end checks read the clean study of the tiny profile shared with tests/test_study.py
(``full_study``); the page helpers are checked on small hand-made notebooks.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pandas as pd

from kdlab.study import report_page as P
from test_study import full_study, tiny_models  # noqa: F401 (session fixtures)

# What must never reach a reader.
NOISE = {
    "IPython history error": re.compile(r"ERROR!|History logging moved"),
    "traceback": re.compile(r"Traceback|\w+Error: .*\n.*File \""),
    "progress bar": re.compile(r"\d+%\|[^|\n]*\|\s*\d+/\d+|\d+/\d+ \[\d+:\d+<"),
    "widget repr": re.compile(r"\b\w*(?:Widget|Explorer|Box|Slider|Dropdown|Image|HTML)\((?:children|value|layout|description)="),
    "object repr": re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>|&lt;[\w.]+ object at 0x[0-9a-f]+&gt;|"
                              r"<(?:Figure|Axes|seaborn\.axisgrid\.\w+) |&lt;(?:Figure|Axes|seaborn\.axisgrid\.\w+) "),
    "warning": re.compile(r"\b\w*Warning: |warnings\.warn\("),
}


def _noise(text: str) -> list[str]:
    found = []
    for name, pattern in NOISE.items():
        m = pattern.search(text)
        if m:
            found.append(f"{name}: ...{text[max(0, m.start() - 80):m.end() + 80]!r}...")
    return found


def _output_texts(nb: nbformat.NotebookNode) -> list[str]:
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                texts.append(out.text)
            elif out.output_type == "error":
                texts.append("Traceback " + out.ename + ": " + out.evalue)
            else:  # what a reader sees: the plain text only when nothing richer is there (a static
                # page cannot render a widget view, so a widget's text/plain repr counts)
                data = out.get("data", {})
                rich = any(k.startswith("image/") or k in ("text/html", "text/markdown", "text/latex") for k in data)
                texts += [v if isinstance(v, str) else str(v) for k, v in data.items()
                          if k.startswith("text/") and not (rich and k == "text/plain")]
    return texts


def _visible_html(html: str) -> str:
    """The page without its stylesheets and scripts (nbconvert's CSS names error classes)."""
    return re.sub(r"<(style|script)\b.*?</\1>", "", html, flags=re.DOTALL)


# --------------------------------------------------------------------------- end to end


def test_no_noise_in_report_or_any_executed_notebook(full_study):
    study = full_study.study_dir
    notebooks = sorted(study.rglob("*.ipynb"))
    names = {p.relative_to(study).parts[0] for p in notebooks}
    assert {"teachers", "runs", "analysis", "report.ipynb", "grid.ipynb"} <= names, names
    problems = {}
    for path in notebooks:
        found = [f for t in _output_texts(nbformat.read(path, as_version=4)) for f in _noise(t)]
        if found:
            problems[str(path.relative_to(study))] = found[:3]
    found = _noise(_visible_html((study / "report.html").read_text()))
    if found:
        problems["report.html"] = found[:3]
    assert not problems, problems


def test_report_first_screen_answers_the_question(full_study):
    html = _visible_html((full_study.study_dir / "report.html").read_text())
    order = [html.find(s) for s in ["Table 1. Regime check", "Table 2. Findings scoreboard", "Table 3. Which knob explains each metric",
                                     "Headline figure", "<img", ">Contents<", "How to read this report"]]
    assert -1 not in order and order == sorted(order), order
    # The scoreboard shows verdict, statistic and interval for the findings.
    board = html[order[1]:order[2]]
    regime_check = html[order[0]:order[1]]  # the roles, each marked, before the scoreboard
    assert "learns at both rates" in regime_check and re.search(r"\b(met|not met|not measured)\b", regime_check)
    assert "verdict" in board and "statistic" in board and "95% interval" in board
    assert "reproduced" in board or "not run" in board or "inconclusive" in board
    # Every anchored section is linked from the table of contents, and the sections of the
    # analysis notebooks are among them.
    anchors = re.findall(r'<a id="(sec-\d+)">', html)
    assert len(anchors) >= 10
    assert all(f'href="#{a}"' in html for a in anchors)
    for section in ["Statistics", "Findings scoreboard", "Results explorer"]:
        assert re.search(rf'href="#sec-\d+">[^<]*{section}', html), section


def test_report_tables_are_titled_and_widgets_are_static_figures(full_study):
    study = full_study.study_dir
    nb = nbformat.read(study / "report.ipynb", as_version=4)
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    tables = sum("<table" in o.get("data", {}).get("text/html", "") for o in outputs)
    titles = sum(bool(re.match(r"\*\*Table \d+\. .*\(.*\)", o.get("data", {}).get("text/markdown", "")))
                 for o in outputs)
    assert tables >= 5 and titles >= tables, (tables, titles)
    html = (study / "report.html").read_text()
    assert html.count("interactive in JupyterLab") >= 2  # the teaching widget and the explorer
    assert "kdlab-static-widget" in html


# ----------------------------------------------------------------------------- page helpers


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_assemble_anchors_headings_and_fills_the_toc(tmp_path: Path):
    md = nbformat.v4.new_markdown_cell
    toc = md("## Contents\n(placeholder)")
    toc.metadata["tags"] = ["toc"]
    params = nbformat.v4.new_code_cell("study_dir = 'x'")
    params.metadata["tags"] = ["parameters"]
    nbformat.write(_nb(md("# Report"), toc, md("## Accuracy\ntext\n```\n# not a heading\n```")), tmp_path / "a.ipynb")
    nbformat.write(_nb(md("# Statistics"), params, md("## 1. Which *knob* matters")), tmp_path / "b.ipynb")
    combined = P.assemble([tmp_path / "a.ipynb", tmp_path / "missing.ipynb", tmp_path / "b.ipynb"])
    sources = [c.source for c in combined.cells]
    assert not any("study_dir" in s for s in sources)  # parameter cells of later notebooks dropped
    assert sources[1] == ("## Contents\n\n- [Report](#sec-1)\n  - [Accuracy](#sec-2)\n- [Statistics](#sec-3)\n"
                          "  - [1. Which knob matters](#sec-4)")
    assert '<a id="sec-2"></a>\n\n## Accuracy' in sources[2] and "# not a heading" in sources[2]
    assert P.assemble([tmp_path / "missing.ipynb"]) is None


def test_long_tables_are_folded_short_ones_kept():
    def table(n):
        return "<table><thead><tr><th>x</th></tr></thead><tbody>" + "<tr><td>1</td></tr>" * n + "</tbody></table>"
    body = "<p>a</p>" + table(3) + table(40)
    out = P.collapse_long_tables(body, max_rows=25)
    assert out.count("<details") == 1 and "40 rows" in out
    assert out.index("<details") > out.index(table(3)) + len(table(3)) - 1


def test_scoreboard_and_knob_views_read_the_statistics_files(tmp_path: Path):
    out = tmp_path / "analysis" / "70_statistics"
    assert P.scoreboard_view(tmp_path) is None and P.knob_view(tmp_path) is None
    out.mkdir(parents=True)
    pd.DataFrame([{"finding": 1, "claim": "c1", "verdict": "reproduced", "statistic_name": "gap", "statistic": 1.5,
                   "ci_low": -0.5, "ci_high": 3.5, "unit": "points"},
                  {"finding": 4, "claim": "c4", "verdict": "not run", "statistic_name": None, "statistic": None,
                   "ci_low": None, "ci_high": None, "unit": None}]).to_csv(out / "scoreboard.csv", index=False)
    pd.DataFrame({"accuracy": [0.81234, 0.1]}, index=["lr", "kl"]).to_csv(out / "knob_table.csv")
    board = P.scoreboard_view(tmp_path)  # a scoreboard written before parts existed
    assert board.loc["1", "statistic"] == "gap = 1.5 points" and board.loc["1", "95% interval"] == "[-0.5, 3.5]"
    assert board.loc["4", "statistic"] == "–" and "not run" in board.loc["4", "verdict"]
    assert P.knob_view(tmp_path).loc["lr", "accuracy"] == 0.81


def test_scoreboard_view_shows_one_row_per_claim(tmp_path: Path):
    """Finding 2 as issue 34 saw it: the KL effect dwarfs the policy effect (2a, as the knob table
    says) while reverse KL is not the spread-out one (2b, 2c). The first screen shows each part
    with its verdict and interval, and the finding's line counts them; the table is never folded."""
    from kdlab.analysis import findings
    from test_findings_parts import GRADIENTS_OK, _reverse_flat

    out = tmp_path / "analysis" / "70_statistics"
    out.mkdir(parents=True)
    findings.scoreboard(_reverse_flat(), GRADIENTS_OK).to_csv(out / "scoreboard.csv", index=False)
    view = P.scoreboard_view(tmp_path)
    assert list(view.columns) == ["claim (STUDY.md)", "verdict", "statistic", "95% interval"]
    assert list(view.index[:5]) == ["1", "2", "2a", "2b", "2c"]
    assert view.loc["2", "verdict"] == "◐ 1 of 3 parts reproduced (2 not reproduced)"
    assert view.loc["2", "statistic"] == "parts 2a–2c" and view.loc["2", "95% interval"] == ""
    assert view.loc["2a", "verdict"] == "✔ reproduced" and view.loc["2a", "claim (STUDY.md)"].startswith("KL direction")
    assert view.loc["2a", "statistic"].startswith("|KL effect| - |policy effect| on accuracy = ")
    assert view.loc["2a", "statistic"].endswith(" points") and view.loc["2a", "95% interval"].startswith("[")
    assert view.loc["2b", "verdict"] == view.loc["2c", "verdict"] == "✘ not reproduced"
    # single-part findings are one row; findings not run are one row
    assert "1a" not in view.index and "7a" not in view.index and view.loc["1", "statistic"] != "–"
    assert "11a" not in view.index and view.loc["11", "verdict"] == "– not run"
    assert view.loc["6b", "statistic"].endswith("%") and view.loc["6b", "95% interval"].endswith("%]")
    # every compound finding's parts follow its line, in order
    labels = list(view.index)
    for n, letters in {2: "abc", 3: "ab", 4: "ab", 5: "ab", 6: "abc", 8: "abc", 10: "abc", 13: "abcde"}.items():
        i = labels.index(str(n))
        assert labels[i + 1:i + 1 + len(letters)] == [f"{n}{c}" for c in letters]
    html = P.scoreboard_html(view).data
    assert P.SCOREBOARD_CLASS in html and "95% interval" in html and "2a" in html
    assert len(view) > P.MAX_ROWS and "<details" not in P.collapse_long_tables(html)  # never folded
    assert P.collapse_long_tables(html.replace(P.SCOREBOARD_CLASS, "other")).count("<details") == 1


def test_noise_patterns_catch_what_the_old_report_showed():
    seen = [
        "ERROR! Session/line number was not unique in database. History logging moved to new session 19",
        "Loading weights:   0%|          | 0/38 [00:00<?, ?it/s]",
        "Map: 100%|##########| 64/64 [00:00<00:00, 2150.12 examples/s]",
        "TeachingKLWidget(children=(HBox(children=(VBox(children=(FloatSlider(value=5.0",
        "<kdlab.widgets.ResultsExplorer object at 0x7f3a2c1d5e10>",
        "Traceback (most recent call last):",
        "/x/seaborn/categorical.py:640: FutureWarning: SeriesGroupBy.grouper is deprecated",
    ]
    assert all(_noise(s) for s in seen), [s for s in seen if not _noise(s)]
    clean = ["Static figure of the TeachingKLWidget widget; it is interactive in JupyterLab",
             "accuracy: 24 runs in 4 groups; filters: none", "Table 2. Findings scoreboard", "progress 50% done"]
    assert not [s for s in clean if _noise(s)]
