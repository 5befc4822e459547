"""`make docs`: the site generated from the committed outputs, checked in a real headless browser (Chromium).

Fast tests check what the generated pages say (captions, the accuracy table) and that the browser check finds
what is broken in a small hand-made site; the slow ones build the whole site (about 20-40 s on 2 cores), load
every page in Chromium, and break a copy of it.
"""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from trainscale.model import catalog
from trainscale.interface import docs, verify
from trainscale.common import io as tsio
from trainscale.studies import registry
from trainscale.studies import validation as validation_study
from conftest import BIN_DIR, REPO_ROOT

FIGURES = REPO_ROOT / "figures"
CONFIG = REPO_ROOT / "config" / "config.yaml"
INFOS = registry.load_all(verify.study_names(CONFIG))


def _declared_figures():
    return sum(o.endswith(".png") for info in INFOS for o in info.outputs)


def _needs_browser():
    if docs.browser() is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")


def _needs_sphinx():
    pytest.importorskip("myst_nb", reason="the docs toolchain is not installed (make docs installs "
                                          "requirements-docs.txt)")
    pytest.importorskip("sphinx_book_theme")


# ----------------------------------------------------------------------------- captions

@pytest.mark.parametrize("info", INFOS, ids=lambda i: i.name)
def test_every_figure_has_a_real_caption(info):
    captions = docs.figure_captions(info, FIGURES / info.name)
    pngs = [o for o in info.outputs if o.endswith(".png")]
    assert sorted(captions) == sorted(pngs)
    for png, caption in captions.items():
        words = caption.strip()
        assert len(words) > 40, f"{info.name}/{png}: caption too short: {caption!r}"
        assert png not in words.split("Drawn from")[0] and words != png.removesuffix(".png"), (info.name, png, caption)
        assert not words.startswith("#"), f"{info.name}/{png}: raw Markdown heading in the caption: {caption!r}"
        drawn = words.partition("Drawn from")[2]
        # a unit closes a variable's entry (before ',', ';' or '.'); "(1) or not (0)" inside a long name is text
        assert not re.search(r" \(1\)(?=[,;.]|$)", drawn), f"{info.name}/{png}: unit '1' shown: {caption!r}"


def test_a_figure_its_notebook_does_not_introduce_gets_a_caption_from_its_dataset(tmp_path):
    info = registry.load("pruning")
    folder = tmp_path / "pruning"
    shutil.copytree(FIGURES / "pruning", folder)
    nb = json.loads((folder / "pruning.ipynb").read_text())
    nb["cells"] = [c for c in nb["cells"] if c["cell_type"] == "code"]  # no text introduces any figure
    (folder / "pruning.ipynb").write_text(json.dumps(nb))
    caption = docs.figure_captions(info, folder)["inference.png"]
    # the figure is drawn by the study module (draw_inference), so the caption comes from the study's datasets
    named = [(v.attrs["long_name"], v.attrs["units"]) for nc in sorted(folder.glob("*.nc"))
             for v in tsio.read_dataset(nc).data_vars.values() if "long_name" in v.attrs]
    assert any(ln[0].upper() + ln[1:] in caption and f"({u})" in caption for ln, u in named), caption
    assert "inference.png" not in caption


def test_a_study_may_declare_its_own_caption(tmp_path, monkeypatch):
    info = registry.load("overlap")
    monkeypatch.setattr(info.module, "CAPTIONS", {"power_cap.png": "**Declared.** By the study module."},
                        raising=False)
    captions = docs.figure_captions(info, FIGURES / "overlap")
    assert captions["power_cap.png"].startswith("**Declared.** By the study module. Drawn from `overlap.nc`")


# ----------------------------------------------------------------------------- the model's accuracy

def test_accuracy_table_is_read_from_validation_nc_and_the_stored_cross_validation():
    nc = FIGURES / "validation" / "validation.nc"
    ds = tsio.read_dataset(nc)
    text = docs.accuracy_markdown(nc)
    cv = catalog.stored_cross_validation()["leave_one_dataset_out"]
    for name in dict.fromkeys(ds["dataset"].values.tolist()):
        err = np.abs(ds["rel_error"].values[ds["dataset"].values == name])
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3] == f"{100 * err.mean():.1f}%" and cells[4] == f"{100 * err.max():.1f}%", row
        target = validation_study.TARGET_MAPE.get(name, validation_study.DEFAULT_TARGET_MAPE)
        assert cells[5] == f"≤ {100 * target:.1f}%", row
        assert cells[6] == (f"{100 * cv[name]['mape']:.1f}%" if name in cv else "—"), row


def test_accuracy_numbers_follow_the_dataset(tmp_path):
    """Nothing typed by hand: halve every error in a copy of validation.nc and the page's numbers halve."""
    ds = tsio.read_dataset(FIGURES / "validation" / "validation.nc").load()
    ds["rel_error"] = ds["rel_error"] / 2
    ds.to_netcdf(tmp_path / "validation.nc", engine="h5netcdf")
    before = docs.accuracy_substitutions(FIGURES / "validation" / "validation.nc")
    after = docs.accuracy_substitutions(tmp_path / "validation.nc")
    published = float(before["mape_published"].rstrip("%"))
    assert float(after["mape_published"].rstrip("%")) == pytest.approx(published / 2, abs=0.06)
    assert after["left_out_published"] == before["left_out_published"]  # from the stored cross-validation


def test_hand_written_pages_quote_no_accuracy_number_a_dataset_holds():
    model = (REPO_ROOT / "docs" / "model.md").read_text()
    assert "```{include} _generated/accuracy.md" in model
    assert not re.search(r"^\| published", model, re.M), "docs/model.md types the accuracy table by hand"
    used = set(re.findall(r"\{\{ *(\w+) *\}\}", model))
    known = set(docs.accuracy_substitutions(FIGURES / "validation" / "validation.nc"))
    assert used and used <= known, f"unknown substitutions in docs/model.md: {sorted(used - known)}"


def test_readme_is_short_and_links_into_the_docs():
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO_ROOT / link).is_file(), f"README links to a missing page: {link}"


# ----------------------------------------------------------------------------- the browser check

_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title></head><body><main>
<h1 id="top">{title}</h1>{body}</main></body></html>"""


def _small_site(root, png_bytes):
    (root / "_images").mkdir(parents=True)
    (root / "_images" / "good.png").write_bytes(png_bytes)
    good = ('<a href="other.html#top">other</a><figure><img src="_images/good.png">'
            "<figcaption><p>Throughput per GPU (tokens/s).</p></figcaption></figure>")
    (root / "index.html").write_text(_PAGE.format(title="index", body=good))
    (root / "other.html").write_text(_PAGE.format(title="other", body='<a href="index.html">back</a>'))


def test_browser_check_passes_a_good_site_and_names_each_broken_thing(tmp_path):
    _needs_browser()
    png = (FIGURES / "overlap" / "step_time.png").read_bytes()
    good = tmp_path / "good"
    _small_site(good, png)
    result = docs.check_site(good)
    assert result["problems"] == [] and result["figures"] == 1 and result["pages"] == 2, result

    bad = tmp_path / "bad"
    _small_site(bad, png)
    (bad / "_images" / "broken.png").write_bytes(b"not a png")
    (bad / "_images" / "bare.png").write_bytes(png)
    body = ('<a href="missing.html">gone</a> <a href="other.html#nowhere">no anchor</a>'
            '<figure><img src="_images/broken.png"><figcaption>A caption.</figcaption></figure>'
            '<figure><img src="_images/bare.png"><figcaption>bare.png</figcaption></figure>'
            '<img src="_images/good.png">')
    (bad / "broken.html").write_text(_PAGE.format(title="broken", body=body))
    problems = docs.check_site(bad)["problems"]
    expected = ["/broken.html: broken link: missing.html (404)", "/broken.html: broken anchor: other.html#nowhere",
                "/broken.html: image does not load: _images/broken.png",
                "/broken.html: figure without a caption: bare.png", "/broken.html: image outside a figure: good.png"]
    assert sorted(problems) == sorted(expected), problems


def test_docs_command_reports_bad_input_in_one_line(tmp_path):
    proc = subprocess.run([str(BIN_DIR / "trainscale"), "docs", "--figures", str(tmp_path / "nowhere")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--figures" in proc.stderr and "nowhere" in proc.stderr


# ----------------------------------------------------------------------------- the whole site (slow)

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    _needs_sphinx()
    return docs.build(tmp_path_factory.mktemp("docs") / "html", FIGURES, CONFIG, REPO_ROOT / "docs")


@pytest.mark.slow
def test_site_builds_and_every_page_passes_the_browser_check(site):
    _needs_browser()
    result = docs.check_site(site)
    assert result["problems"] == [], "\n".join(result["problems"][:20])
    # every figure twice: on its study's page and in its executed notebook, each with its caption
    assert result["figures"] == 2 * _declared_figures(), result
    assert result["pages"] >= 2 * len(INFOS) + 8
    for page in ("search.html", "searchindex.js", "model.html", "api.html", "verdicts.html", "studies.html"):
        assert (site / page).is_file(), page
    model = (site / "model.html").read_text()
    subs = docs.accuracy_substitutions(FIGURES / "validation" / "validation.nc")
    assert subs["left_out_vtrain_single"] in model and "{{" not in model


@pytest.mark.slow
def test_browser_check_finds_what_is_broken_in_a_built_page(site, tmp_path):
    _needs_browser()
    broken = tmp_path / "html"
    shutil.copytree(site, broken)
    page = broken / "studies" / "overlap.html"
    text = page.read_text()
    text = re.sub(r"<figcaption>.*?</figcaption>", "", text, count=1, flags=re.S)
    text = text.replace("</main>", '<a href="../no-such-page.html">x</a></main>', 1)
    page.write_text(text)
    problems = docs.check_site(broken)["problems"]
    assert any(p.startswith("/studies/overlap.html: figure without a caption") for p in problems), problems
    assert "/studies/overlap.html: broken link: ../no-such-page.html (404)" in problems, problems


@pytest.mark.slow
def test_a_build_with_a_warning_keeps_the_last_good_site(site, tmp_path):
    source = tmp_path / "docs"
    shutil.copytree(REPO_ROOT / "docs", source)
    index = source / "index.md"
    index.write_text(index.read_text() + "\n![a figure that is not there](missing.png)\n")
    out = tmp_path / "html"
    shutil.copytree(site, out)
    before = (out / "index.html").read_bytes()
    one = tmp_path / "config.yaml"
    one.write_text("studies:\n  overlap: {full: {}, quick: {}}\n")
    with pytest.raises(docs.DocsError, match=r"^docs: sphinx reported \d+ warning line\(s\), the site was not "
                                             r"replaced .*missing\.png"):
        docs.build(out, FIGURES, one, source)
    assert (out / "index.html").read_bytes() == before
    assert not list(tmp_path.glob(".html.*")), "the temporary build folder was left behind"
