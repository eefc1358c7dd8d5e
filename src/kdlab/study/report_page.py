"""The study's ``report.html`` as a page a reader wants: the answer first, then everything else.

- ``scoreboard_view`` / ``knob_view``: the first screen's two tables, read from the files the
  statistics section (``70_statistics``) writes: the findings scoreboard, one row per claim (a
  compound finding's line counts its parts, 2a, 2b, ... follow it, each with its verdict,
  statistic and 95% interval; ``scoreboard_html`` shows it, never folded) and "which knob
  explains each metric" (partial eta squared per metric);
- ``assemble``: the executed report notebook followed by the analysis notebooks as one notebook,
  every level-1 and level-2 heading given an anchor and listed in a table of contents (put in
  the report's cell tagged ``toc``);
- ``collapse_long_tables``: an HTML table longer than ``MAX_ROWS`` rows is folded into a
  ``<details>`` element (its section's files hold the same numbers as CSV).
"""
from __future__ import annotations

import html as _html
import re
from pathlib import Path
from typing import Any

import pandas as pd

MAX_ROWS = 25  # longer tables are collapsed in report.html
TOC_TAG = "toc"

_VERDICT_MARK = {"reproduced": "✔ reproduced", "not reproduced": "✘ not reproduced",
                 "inconclusive": "? inconclusive", "not run": "– not run"}


def _stat_dir(study_dir: str | Path) -> Path:
    return Path(study_dir) / "analysis" / "70_statistics"


def _number(v: Any, unit: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if unit == "share":
        return f"{100 * x:.1f}%"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _text(r: dict, key: str) -> str:
    v = r.get(key)
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def _statistic(r: dict, unit: str) -> tuple[str, str]:
    """(statistic with its name and unit, 95% interval) of a scoreboard row."""
    stat = _number(r.get("statistic"), unit)
    name = _text(r, "statistic_name")
    if stat != "–" and name:
        stat = f"{name} = {stat}"
    if stat != "–" and unit == "points":  # shares are shown in %; ratios, rho, gradient entries have no unit
        stat += f" {unit}"
    lo, hi = r.get("ci_low"), r.get("ci_high")
    interval = (f"[{_number(lo, unit)}, {_number(hi, unit)}]" if lo is not None and hi is not None
                and pd.notna(lo) and pd.notna(hi) else "–")
    return stat, interval


def _summary_mark(verdict: str, n_parts: int, n_reproduced: int) -> str:
    """A compound finding's line: its count of parts, marked ✔ (all hold), ✘ (none holds and some
    part is refuted), ◐ (some hold) or ? (none holds, none refuted)."""
    if n_reproduced == n_parts:
        return f"✔ {verdict}"
    if n_reproduced:
        return f"◐ {verdict}"
    return f"✘ {verdict}" if "not reproduced" in verdict else f"? {verdict}"


REGIME_COLUMN = "regime"  # the scoreboard's note of the unmet regime roles a verdict rests on


def _regime(r: dict) -> str:
    """A scoreboard row's regime note as shown: "⚠ " and the roles it rests on that are not met,
    each with its tasks ("⚠ learns: countdown-3"; a role not measured says so)."""
    note = _text(r, "regime").removeprefix("rests on unmet roles: ")
    note = re.sub(r" \(not met: ([^)]*)\)", r": \1", note)  # "learns (not met: kb-mc)" -> "learns: kb-mc"
    return f"⚠ {note}" if note else ""


POWER_COLUMN = "power"  # a part's interval half-width against the distance to its bound (kdlab.analysis.power)


def scoreboard_view(study_dir: str | Path) -> pd.DataFrame | None:
    """The findings scoreboard as shown first, one row per claim: finding (``2`` for the finding,
    ``2a``, ``2b``, ... for its parts), claim, verdict, statistic (with its name and unit) and its
    95% interval; None when section 70 did not write ``scoreboard.csv``.

    A finding with several parts gets its own line, which counts the parts that hold ("1 of 2
    parts reproduced (1 not reproduced)") and shows no statistic, followed by one row per part with
    that part's claim, verdict, statistic and interval. A finding with a single part, or not run,
    is one row. Column ``regime`` (when section 70 wrote one): "⚠ <role>: <tasks>" on each row
    whose verdict rests on a role of the regime check that is not met. Column ``power`` (when
    section 70 wrote one): the part's 95% interval half-width on its bound's side against the
    distance from its estimate to the bound, and for an inconclusive part about how many times the
    data it needs. A scoreboard written before parts existed (no ``part`` column) is shown as it is."""
    path = _stat_dir(study_dir) / "scoreboard.csv"
    if not path.exists():
        return None
    board = pd.read_csv(path, keep_default_na=False, na_values=[""])
    if "part" not in board.columns:
        board["part"] = ""
    board["part"] = board["part"].fillna("").astype(str)
    rows = []
    for number, group in board.groupby("finding", sort=False):
        records = group.to_dict(orient="records")
        summary = next((r for r in records if not r["part"]), records[0])
        parts = [r for r in records if r["part"]]
        unit = _text(summary, "unit")
        verdict = _text(summary, "verdict")
        if len(parts) <= 1:
            stat, interval = _statistic(summary, unit)
            rows.append({"finding": str(number), "claim (STUDY.md)": _text(summary, "claim"),
                         "verdict": _VERDICT_MARK.get(verdict, verdict), "statistic": stat, "95% interval": interval,
                         POWER_COLUMN: _text(parts[0] if parts else summary, POWER_COLUMN),
                         REGIME_COLUMN: _regime(summary)})
            continue
        n_rep = sum(p["verdict"] == "reproduced" for p in parts)
        rows.append({"finding": str(number), "claim (STUDY.md)": _text(summary, "claim"),
                     "verdict": _summary_mark(verdict, len(parts), n_rep),
                     "statistic": f"parts {number}{parts[0]['part']}–{number}{parts[-1]['part']}", "95% interval": "",
                     POWER_COLUMN: "", REGIME_COLUMN: ""})
        for p in parts:
            stat, interval = _statistic(p, _text(p, "unit"))
            if p["verdict"] == "not run":
                stat = _text(p, "detail").split("not run", 1)[-1].strip(" ()") or "–"
            rows.append({"finding": f"{number}{p['part']}", "claim (STUDY.md)": _text(p, "claim"),
                         "verdict": _VERDICT_MARK.get(p["verdict"], p["verdict"]), "statistic": stat,
                         "95% interval": interval, POWER_COLUMN: _text(p, POWER_COLUMN), REGIME_COLUMN: _regime(p)})
    view = pd.DataFrame(rows).set_index("finding")
    return view.drop(columns=[c for c in (POWER_COLUMN, REGIME_COLUMN) if c not in board.columns])


SCOREBOARD_CLASS = "kdlab-scoreboard"  # the first screen's table: never folded (collapse_long_tables)
# compact rows: one line per claim where the claim fits, so that about 30 claims (quick) fit the first screen
SCOREBOARD_CELL = "text-align: left; vertical-align: top; font-size: 11px; line-height: 1.2; padding: 1px 4px"


def _compact_cells(view: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The first screen's cells of ``scoreboard_view`` and their hover texts: a statistic shows
    its value ("33.4 points", the statistic's name on hover: the claim says what it tests); a
    compound finding's line shows its mark and count ("◐ 1 of 3 reproduced", the full verdict on
    hover; its parts follow with theirs)."""
    cells, hover = view.copy(), pd.DataFrame("", index=view.index, columns=view.columns)
    for label, row in view.iterrows():
        stat = str(row.get("statistic", ""))
        if " = " in stat:
            value = stat.rsplit(" = ", 1)[1]
            cells.loc[label, "statistic"] = value.replace(" points", " pts")
            hover.loc[label, "statistic"] = stat
        verdict = str(row.get("verdict", ""))
        if stat.startswith("parts ") and " parts reproduced" in verdict:
            cells.loc[label, "verdict"] = verdict.split(" (", 1)[0].replace(" parts reproduced", " reproduced")
            cells.loc[label, "statistic"] = stat.removeprefix("parts ")
            hover.loc[label, "verdict"] = verdict
    return cells, hover


def scoreboard_html(view: pd.DataFrame) -> Any:
    """``scoreboard_view`` as the report shows it (compacted by ``_compact_cells``, the long
    texts on hover): the lines of compound findings in bold, the parts under them indented; a
    table of class ``SCOREBOARD_CLASS``, which ``collapse_long_tables`` leaves open however many
    rows it has (it is the answer of the first screen)."""
    from IPython.display import HTML

    cells, hover = _compact_cells(view)

    def style(row: pd.Series) -> list[str]:
        label = str(row.name)
        compound = label.isdigit() and str(view.loc[row.name, "statistic"]).startswith("parts ")
        return ["font-weight: bold" if compound else ""] * len(row)

    nowrap = [c for c in cells.columns if c != "claim (STUDY.md)"]
    styler = (cells.style.apply(style, axis=1)
              .set_table_attributes(f'class="dataframe {SCOREBOARD_CLASS}"')
              .set_table_styles([{"selector": "td, th", "props": SCOREBOARD_CELL}])
              .set_properties(subset=nowrap, **{"white-space": "nowrap"})
              .set_tooltips(hover, props="visibility: hidden; position: absolute; z-index: 1; background: #ffe; "
                                         "border: 1px solid #999; padding: 2px 4px; font-size: 12px; white-space: nowrap")
              .hide(axis="index", names=True)  # no header row of its own for the index name
              .map_index(lambda label: "" if str(label).isdigit() else "padding-left: 1.5em", axis=0))
    return HTML(styler.to_html())


def compact_html(view: pd.DataFrame) -> Any:
    """A small table of the first screen (the regime check) in the scoreboard's compact style."""
    from IPython.display import HTML

    view = view.rename_axis(index=None, columns=None)  # one header row: the row labels name themselves
    styler = (view.style.set_table_attributes('class="dataframe"')
              .set_table_styles([{"selector": "td, th", "props": SCOREBOARD_CELL}]))
    return HTML(styler.to_html())


def knob_view(study_dir: str | Path) -> pd.DataFrame | None:
    """Partial eta squared (0-1) per factor or interaction (rows) and metric (columns), from
    ``knob_table.csv``; None when it is missing or empty."""
    path = _stat_dir(study_dir) / "knob_table.csv"
    if not path.exists():
        return None
    knobs = pd.read_csv(path, index_col=0)
    if knobs.empty:
        return None
    knobs.index.name = "factor"
    return knobs.round(2)


# ------------------------------------------------------------------------------ assembling

_HEADING_RE = re.compile(r"^(#{1,2})\s+(.+?)\s*#*\s*$")


def _plain(text: str) -> str:
    """Heading text without markdown emphasis, code ticks or math dollars."""
    return re.sub(r"[*_`$]", "", text).strip()


def add_anchors(cells: list[Any]) -> list[tuple[int, str, str]]:
    """Give every level-1/2 markdown heading of ``cells`` an HTML anchor (edited in place);
    returns (level, title, anchor id) in order."""
    entries = []
    for cell in cells:
        if cell.get("cell_type") != "markdown" or TOC_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        lines, changed, fence = cell["source"].split("\n"), False, False
        out = []
        for line in lines:
            if line.lstrip().startswith("```"):
                fence = not fence
            m = None if fence else _HEADING_RE.match(line)
            if m:
                anchor = f"sec-{len(entries) + 1}"
                entries.append((len(m.group(1)), _plain(m.group(2)), anchor))
                out += [f'<a id="{anchor}"></a>', "", line]
                changed = True
            else:
                out.append(line)
        if changed:
            cell["source"] = "\n".join(out)
    return entries


def toc_markdown(entries: list[tuple[int, str, str]]) -> str:
    lines = ["## Contents", ""]
    for level, title, anchor in entries:
        if title == "Contents":
            continue
        lines.append(("  " if level == 2 else "") + f"- [{title}](#{anchor})")
    return "\n".join(lines)


def assemble(notebooks: list[Path]) -> Any:
    """The executed notebooks as one notebook (parameter cells of all but the first dropped),
    with heading anchors and the table of contents in the cell tagged ``toc`` (or, without one,
    after the first cell); None when none of them exists."""
    import nbformat

    combined = None
    for path in notebooks:
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        if combined is None:
            combined = nb
        else:
            combined.cells.extend(c for c in nb.cells if "parameters" not in c.get("metadata", {}).get("tags", [])
                                  and "injected-parameters" not in c.get("metadata", {}).get("tags", []))
    if combined is None:
        return None
    toc = toc_markdown(add_anchors(combined.cells))
    tagged = [c for c in combined.cells if TOC_TAG in c.get("metadata", {}).get("tags", [])]
    if tagged:
        tagged[0]["source"] = toc
    else:
        combined.cells.insert(1, nbformat.v4.new_markdown_cell(toc))
    return combined


_TABLE_RE = re.compile(r"<table\b[^>]*>.*?</table>", re.DOTALL)


def collapse_long_tables(body: str, max_rows: int = MAX_ROWS) -> str:
    """Fold every HTML table with more than ``max_rows`` body rows into a ``<details>``, except the
    findings scoreboard (class ``SCOREBOARD_CLASS``)."""
    def fold(m: re.Match) -> str:
        table = m.group(0)
        if SCOREBOARD_CLASS in table[:table.find(">") + 1]:
            return table  # the scoreboard stays open
        tbody = table.split("<tbody", 1)
        rows = tbody[1].count("<tr") if len(tbody) == 2 else table.count("<tr")
        if rows <= max_rows:
            return table
        return (f"<details class=\"kdlab-long-table\"><summary>show the full table ({rows} rows; the section's "
                f"files hold it as CSV)</summary>{table}</details>")

    return _TABLE_RE.sub(fold, body)


def export_html(notebooks: list[Path]) -> str | None:
    """``report.html``'s text: ``assemble`` exported without code, long tables collapsed."""
    from nbconvert import HTMLExporter

    combined = assemble(notebooks)
    if combined is None:
        return None
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(combined)
    return collapse_long_tables(body)


def title(text: str) -> Any:
    """A table's title line (bold), for ``display`` before the table."""
    from IPython.display import Markdown

    return Markdown(f"**{_html.escape(text, quote=False)}**")
