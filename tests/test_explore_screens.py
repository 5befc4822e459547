"""The explore widget on a laptop screen, in a real browser (issue 34 item 4): JupyterLab at 1366 px and at 1600 px
wide with the file browser open leaves the notebook about 1000 px and 1250 px; at both widths nothing of the widget
runs off the page (no sideways scroll), every bar of both charts is visible, no button or label is cut ("select...")
and the best-plans table fits. The page is the widget tree's layout (tests/explore_page.py), drawn by headless
Chromium; a screenshot of each width is kept in the test's temporary folder."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import plotly
import pytest

from explore_page import explorer_page
from trainscale.interface import docs, explore

pytestmark = pytest.mark.slow

#: the notebook's width in JupyterLab with the file browser open, by screen width
NOTEBOOK_WIDTH_PX = {1366: 1000, 1600: 1250}


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    browser = docs.browser()
    if browser is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    ex = explore.Explorer(model="llama2-70b", system="dgx-h100", gpus=512, global_batch=1024, tp=8, pp=4,
                          micro_batch=1, recompute="selective", flash_attention=True)
    ex.search()
    folder = tmp_path_factory.mktemp("explore-screens")
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", folder / "plotly.min.js")
    path = folder / "explorer.html"
    path.write_text(explorer_page(ex), encoding="utf-8")
    return browser, path


def _chromium(browser, path: Path, width: int, *args) -> str:
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=10000", f"--window-size={width},1500", *args, path.as_uri()],
                          check=True, capture_output=True, text=True, timeout=180)
    return done.stdout


@pytest.mark.parametrize("screen", sorted(NOTEBOOK_WIDTH_PX))
def test_the_widget_fits_the_notebook_of_a_laptop_screen(page_file, screen):
    browser, path = page_file
    width = NOTEBOOK_WIDTH_PX[screen]
    dom = _chromium(browser, path, width, "--dump-dom")
    found = re.search(r"<pre id=\"measure\">(.*?)</pre>", dom, re.S)
    assert found and found.group(1), "the measurement script did not run"
    got = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    _chromium(browser, path, width, f"--screenshot={path.with_name(f'explorer-{screen}.png')}")
    assert got["page_overflow_px"] <= 0, got
    for name, chart in got["charts"].items():
        assert chart["bars"] > 0 and chart["bars_cut"] == 0, (name, got)
        assert chart["right_px"] <= width + 0.5, (name, got)
    assert got["table_overflow_px"] is not None and got["table_overflow_px"] <= 0, got
    assert got["cut_labels"] == [], got
