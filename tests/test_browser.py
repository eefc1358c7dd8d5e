"""End to end in a real browser: notebooks 40 and 80 in JupyterLab and the study's report.html,
driven by Playwright in headless Chromium.

JupyterLab is served on loopback (random free port, token auth, ``--no-browser``) from a temporary
folder holding parameterised copies of ``notebooks/40_teaching_kl.ipynb`` and
``notebooks/80_explorer.ipynb`` (on a synthetic results table). The tests run all cells, move a
control (drag the teaching widget's "mode 1 position" slider; pick another metric in the
explorer) and check that the widget's figure (the blob URL of its image) and its text readout
change. The report test opens the tiny study's ``report.html`` at 1400 x 900 and checks that the
findings scoreboard is on that first screen. Screenshots are kept under ``outputs/test-artifacts/``.

Needs Debian's ``chromium`` (``/usr/bin/chromium``) and the ``playwright`` Python package (its
own browser download is not used); the test is skipped, saying which is missing, without them.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_study import full_study, tiny_models  # noqa: F401 (session fixtures: the tiny study's report)

REPO_ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO_ROOT / "outputs" / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
NOTEBOOK = "40_teaching_kl.ipynb"
EXPLORER = "80_explorer.ipynb"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, method: str = "GET", timeout: float = 2.0) -> int:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status


@pytest.fixture
def jupyterlab(tmp_path):
    """(base_url, token, folder) of a JupyterLab serving prepared copies of notebooks 40 and 80."""
    import papermill as pm

    from kdlab.analysis.synthetic import synthetic_results

    _needs_browser()  # skip before starting a server that nothing would use
    pm.execute_notebook(str(REPO_ROOT / "notebooks" / NOTEBOOK), str(tmp_path / NOTEBOOK),
                        parameters={"study_dir": str(tmp_path / "study"), "steps": 150}, prepare_only=True,
                        kernel_name="python3")
    (tmp_path / "synthetic").mkdir()
    synthetic_results(seeds=(0, 1)).to_parquet(tmp_path / "synthetic" / "results.parquet")
    pm.execute_notebook(str(REPO_ROOT / "notebooks" / EXPLORER), str(tmp_path / EXPLORER),
                        parameters={"study_dir": str(tmp_path / "synthetic"), "metric": "accuracy", "x": "lr",
                                    "hue": "kl"}, prepare_only=True, kernel_name="python3")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"), IPYTHONDIR=str(tmp_path / "ipython"))
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--expose-app-in-browser",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    # No "get notified about Jupyter news?" toast over the screenshot (and no network fetch).
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    log = (tmp_path / "jupyterlab.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a loaded 2-core machine needs minutes to start it
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{(tmp_path / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                if _request(f"{base}/api/status?token={token}") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("jupyter lab did not answer within 300 s")
            time.sleep(0.5)
        yield base, token, tmp_path
    finally:
        try:
            _request(f"{base}/api/shutdown?token={token}", method="POST", timeout=10)  # stops kernels too
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def _needs_browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium) to run the "
                    "browser test")
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright; no `playwright "
                    "install` needed, the system chromium is used)")


KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle';
}"""


IMAGE_CHANGED = "([sel, before]) => { const i = document.querySelector(sel); return i && i.src !== before; }"


@contextlib.contextmanager
def _live_notebook(notebook: str):
    """A Chromium page on JupyterLab with ``notebook`` open and every cell run; yields
    (page, image, readout) once the live widget's figure and readout are shown."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(120_000)  # JupyterLab's first load is slow on a loaded 2-core machine
            page.goto(notebook)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            image = page.locator("img.widget-image").first
            readout = page.locator(".jupyter-widgets .kdlab-readout").first  # the live widget's, not a static copy
            image.wait_for(timeout=240_000)
            readout.wait_for(timeout=60_000)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            assert page.locator(".kdlab-static-widget").count() == 0  # JupyterLab shows the live widget
            yield page, image, readout
        finally:
            browser.close()


@pytest.mark.slow
def test_teaching_notebook_in_jupyterlab_slider_changes_figure(jupyterlab):
    base, token, folder = jupyterlab
    with _live_notebook(f"{base}/lab/tree/{NOTEBOOK}?token={token}") as (page, image, readout):
        src_before, text_before = image.get_attribute("src"), readout.text_content()
        assert src_before and src_before.startswith("blob:")
        assert "reverse KL student" in text_before

        slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="mode 1 position"))
        handle = slider.locator(".noUi-handle").first
        handle.scroll_into_view_if_needed()
        box = handle.bounding_box()
        assert box is not None
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x - 12, y, steps=6)  # drag mode 1 a few tokens to the left
        page.mouse.up()
        new_value = slider.locator(".widget-readout").inner_text()
        assert float(new_value) < 5.0, f"the slider did not move (readout {new_value})"

        page.wait_for_function(
            IMAGE_CHANGED, arg=["img.widget-image", src_before], timeout=120_000)
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        src_after, text_after = image.get_attribute("src"), readout.text_content()
        image.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "40_teaching_kl_browser.png"))
        assert src_after != src_before
        assert text_after != text_before, "the figure changed but the readout did not"
    # The notebook ran to the end inside the browser session: its outputs were written.
    assert (folder / "study" / "analysis" / "40_teaching_kl" / "teaching_kl.json").exists()
    shutil.copy(folder / "study" / "analysis" / "40_teaching_kl" / "bimodal_tokens.png",
                ARTIFACTS / "40_teaching_kl_bimodal_tokens.png")


@pytest.mark.slow
def test_explorer_notebook_in_jupyterlab_metric_choice_changes_figure(jupyterlab):
    base, token, folder = jupyterlab
    with _live_notebook(f"{base}/lab/tree/{EXPLORER}?token={token}") as (page, image, summary):
        src_before, text_before = image.get_attribute("src"), summary.text_content()
        assert src_before and src_before.startswith("blob:")
        assert text_before.startswith("accuracy:")

        metric = page.locator(".widget-dropdown", has=page.locator("label", has_text="metric")).locator("select")
        metric.scroll_into_view_if_needed()
        metric.select_option("sparsity")
        page.wait_for_function(
            IMAGE_CHANGED, arg=["img.widget-image", src_before], timeout=120_000)
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        src_after, text_after = image.get_attribute("src"), summary.text_content()
        image.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "80_explorer_browser.png"))
        assert src_after != src_before
        assert text_after.startswith("sparsity:"), text_after
    assert (folder / "synthetic" / "analysis" / "80_explorer" / "explorer.png").exists()  # it ran to the end


@pytest.mark.slow
def test_report_first_screen_shows_the_scoreboard(full_study):
    from playwright.sync_api import sync_playwright

    _needs_browser()
    report = full_study.study_dir / "report.html"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(report.as_uri())
            page.screenshot(path=str(ARTIFACTS / "report_first_screen.png"))  # the first 1400 x 900 pixels
            title = page.get_by_text("Table 2. Findings scoreboard", exact=False).first
            table = page.locator("table", has=page.locator("th", has_text="95% interval")).first
            title_box, table_box = title.bounding_box(), table.bounding_box()
            assert title_box and table_box, "no scoreboard in the report"
            assert 0 <= title_box["y"] < table_box["y"]
            rows = table.locator("tbody tr")
            assert rows.count() >= 6
            first, last = rows.first.bounding_box(), rows.last.bounding_box()
            # the whole scoreboard (verdict, statistic, interval of every finding) is on the first screen
            assert last["y"] + last["height"] <= 900, f"the scoreboard ends at y={last['y'] + last['height']:.0f}"
            assert first["x"] >= 0 and table_box["x"] + table_box["width"] <= 1400
            verdicts = table.locator("tbody tr td:nth-child(3)").all_inner_texts()
            assert all(re.search(r"reproduced|inconclusive|not run", v) for v in verdicts), verdicts
        finally:
            browser.close()


def test_a_quick_sized_scoreboard_fits_the_first_screen(full_study, tmp_path):
    """The quick study's scoreboard (findings 1-6 with their parts, 7-13 not run: 25 rows), with
    its power and regime columns filled, swapped into the tiny report: every row, whole, within
    the first 1400 x 900 pixels."""
    import pandas as pd
    from playwright.sync_api import sync_playwright

    from kdlab.analysis import findings, power
    from kdlab.study import report_page as P
    from test_findings_parts import GRADIENTS_OK, _paper

    _needs_browser()
    board = findings.scoreboard(_paper(), GRADIENTS_OK)
    quick = board[(board["finding"] <= 6) | (board["part"] == "")].copy()
    later = quick["finding"] > 6
    quick.loc[later, ["verdict", "statistic", "ci_low", "ci_high"]] = ["not run", None, None, None]
    quick["regime"] = ["" if f in (4, 6) or p == "" else
                       "rests on unmet roles: high-rate band (not met: countdown-3, rules-mc)" if f == 3 else
                       "rests on unmet roles: learns (not met: countdown-3)" for f, p in zip(quick["finding"], quick["part"])]
    quick = power.add_power(quick)
    out = tmp_path / "analysis" / "70_statistics"
    out.mkdir(parents=True)
    quick.to_csv(out / "scoreboard.csv", index=False)
    view = P.scoreboard_view(tmp_path)
    assert len(view) == 25 and view["power"].str.contains("<").sum() >= 8
    table = P.scoreboard_html(view).data
    page = (full_study.study_dir / "report.html").read_text()
    start = page.rfind("<style", 0, page.index(P.SCOREBOARD_CLASS))
    end = page.index("</table>", start) + len("</table>")
    report = tmp_path / "report.html"
    report.write_text(page[:start] + table + page[end:])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(report.as_uri())
            page.screenshot(path=str(ARTIFACTS / "report_first_screen_quick_sized.png"))
            box = page.locator(f"table.{P.SCOREBOARD_CLASS}").first.bounding_box()
            rows = page.locator(f"table.{P.SCOREBOARD_CLASS} tbody tr")
            assert rows.count() == 25
            last = rows.last.bounding_box()
            assert last["y"] + last["height"] <= 900, f"the scoreboard ends at y={last['y'] + last['height']:.0f}"
            assert box["x"] >= 0 and box["x"] + box["width"] <= 1400, box
        finally:
            browser.close()
