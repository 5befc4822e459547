"""`make report`: one static page with every figure, loaded in a real headless browser (Chromium)."""

import re
import shutil
import subprocess

import pytest

from trainscale import report, verify
from trainscale.studies import registry
from conftest import REPO_ROOT

CONFIG = REPO_ROOT / "config" / "config.yaml"


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _declared_figures():
    return sum(o.endswith(".png") for info in registry.load_all(verify.study_names(CONFIG)) for o in info.outputs)


def _dump_dom(page):
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_report_loads_in_a_browser_with_every_figure(tmp_path):
    page = report.build_report(REPO_ROOT / "figures", CONFIG, tmp_path / "report.html")
    body = re.search(r"<body([^>]*)>", _dump_dom(page)).group(1)
    shown = int(re.search(r'data-figures="(\d+)"', body).group(1))
    loaded = int(re.search(r'data-figures-loaded="(\d+)"', body).group(1))
    assert shown == _declared_figures() and loaded == shown, body


def test_a_broken_figure_is_seen_by_the_browser(tmp_path):
    figures = tmp_path / "figures"
    shutil.copytree(REPO_ROOT / "figures", figures)
    victim = next(figures.glob("*/*.png"))
    victim.write_bytes(b"not a png")
    page = report.build_report(figures, CONFIG, tmp_path / "report.html")
    body = re.search(r"<body([^>]*)>", _dump_dom(page)).group(1)
    loaded = int(re.search(r'data-figures-loaded="(\d+)"', body).group(1))
    assert loaded == _declared_figures() - 1


def test_report_holds_both_tables_and_the_captions(tmp_path):
    text = report.build_report(REPO_ROOT / "figures", CONFIG, tmp_path / "report.html").read_text()
    assert "Paper vs ours" in text and "How right the performance model is" in text
    rows = report.accuracy_rows(REPO_ROOT / "figures" / "validation" / "validation.nc")
    assert {r["dataset"] for r in rows} >= {"published", "vtrain-multi"}
    for r in rows:
        assert f"<td>{r['dataset']}</td><td>{r['runs']}</td>" in text
    captions = report.figure_captions(REPO_ROOT / "figures" / "overlap" / "overlap.ipynb")
    assert captions and all(text for text in captions.values())
