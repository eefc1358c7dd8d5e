"""End to end in a real browser: notebook 40 in JupyterLab, driven by Playwright in headless Chromium.

JupyterLab is served on loopback (random free port, token auth, ``--no-browser``) from a temporary
folder holding a parameterised copy of ``notebooks/40_teaching_kl.ipynb``. The test runs all
cells, drags the "mode 1 position" slider, and checks that the widget's figure (the blob URL of
its image) and its text readout change. A screenshot is kept under ``outputs/test-artifacts/``.

Needs Debian's ``chromium`` (``/usr/bin/chromium``) and the ``playwright`` Python package (its
own browser download is not used); the test is skipped, saying which is missing, without them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO_ROOT / "outputs" / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
NOTEBOOK = "40_teaching_kl.ipynb"


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
    """(base_url, token, folder) of a JupyterLab serving a prepared copy of notebook 40."""
    import papermill as pm

    _needs_browser()  # skip before starting a server that nothing would use
    pm.execute_notebook(str(REPO_ROOT / "notebooks" / NOTEBOOK), str(tmp_path / NOTEBOOK),
                        parameters={"study_dir": str(tmp_path / "study"), "steps": 150}, prepare_only=True,
                        kernel_name="python3")
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
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{(tmp_path / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                if _request(f"{base}/api/status?token={token}") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("jupyter lab did not answer within 90 s")
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


@pytest.mark.slow
def test_teaching_notebook_in_jupyterlab_slider_changes_figure(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, folder = jupyterlab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

            image = page.locator("img.widget-image").first
            readout = page.locator(".kdlab-readout").first
            image.wait_for(timeout=240_000)
            readout.wait_for(timeout=60_000)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            src_before, text_before = image.get_attribute("src"), readout.inner_text()
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
                "([sel, before]) => { const i = document.querySelector(sel); return i && i.src !== before; }",
                arg=["img.widget-image", src_before], timeout=120_000)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            src_after, text_after = image.get_attribute("src"), readout.inner_text()
            image.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "40_teaching_kl_browser.png"))
            assert src_after != src_before
            assert text_after != text_before, "the figure changed but the readout did not"
        finally:
            browser.close()
    # The notebook ran to the end inside the browser session: its outputs were written.
    assert (folder / "study" / "analysis" / "40_teaching_kl" / "teaching_kl.json").exists()
    shutil.copy(folder / "study" / "analysis" / "40_teaching_kl" / "bimodal_tokens.png",
                ARTIFACTS / "40_teaching_kl_bimodal_tokens.png")
