"""The documentation site: ``make docs`` -> ``results/docs/html/index.html``, built by Sphinx with myst-nb and the
book theme from ``docs/`` (pages written by hand) and pages generated here from the committed outputs alone.

Generated, never committed, never typed by hand:

* one page per study of the registry (:mod:`trainscale.studies.registry`): its paper, its paper-vs-ours records
  (``figures/<study>/comparison.csv``), every figure with its caption, the variables of its datasets, and its
  executed notebook (``figures/<study>/<study>.ipynb``, rendered as it was run: myst-nb executes nothing);
* the verdict table of every study (:func:`trainscale.interface.verify.gallery_markdown`) and the figure gallery;
* the model's accuracy: the table per measured dataset and the sentences that quote it, from
  ``figures/validation/validation.nc`` and the stored cross-validation (:func:`trainscale.model.catalog.stored_cross_validation`),
  against the targets of :mod:`trainscale.studies.validation`.

A figure's caption (:func:`figure_captions`) is the study's own where its module declares one (``CAPTIONS``, file
name -> text), else the text of the notebook cell that introduces the code drawing it, else a sentence built from
the ``long_name`` and ``units`` of the dataset variables that code reads; every caption ends with the datasets and
variables it is drawn from. It is never the file name.

The build writes into a temporary folder and moves the site into place only when Sphinx finished without a
warning (a missing image or a broken cross-reference is a warning), so a failed build leaves the last good site.
:func:`check_site` then loads every page in a headless Chromium and reports broken links, images that do not load
and figures without a caption.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from ..common import comparison
from ..common import io as tsio
from ..studies import registry
from .verify import study_names

__all__ = ["figure_captions", "accuracy_rows", "accuracy_markdown", "accuracy_substitutions", "study_page",
           "generate_sources", "build", "check_site", "browser", "DocsError"]

GENERATED = "_generated"  # folder of the build's source tree that holds generated includes


class DocsError(RuntimeError):
    """The site could not be built or checked; the message is one line saying what and where."""


# ----------------------------------------------------------------------------- captions

def _quoted(name: str) -> re.Pattern:
    return re.compile(r"[\"']" + re.escape(name) + r"[\"']")


def _markdown_caption(text: str) -> str:
    """A figure caption from the markdown cell that introduces it: from its first bold-led paragraph on when it has
    one ("## Figures / Drawn from ... / **Step time** ..."), else its heading as a bold title and its paragraphs."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    headings = [p.lstrip("#").strip() for p in paragraphs if p.startswith("#")]
    body = [p for p in paragraphs if not p.startswith("#")]
    bold = [i for i, p in enumerate(body) if p.startswith("**")]
    if bold:
        body = body[bold[0]:]
    elif headings:
        title = headings[-1].split("\n")[0].strip().rstrip(".:")
        body = [f"**{title}{'' if title.endswith(('?', '!')) else '.'}**"] + body
    return " ".join(" ".join(p.split()) for p in body)


def _units(units: str | None) -> str:
    """A unit as a caption shows it: none for a pure number ("1", "", "count" stays)."""
    return "" if units in (None, "", "1", "-", "dimensionless") else f" ({units})"


@functools.lru_cache(maxsize=None)
def _variables(path: str) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """(name, long_name, units, dims) of every data variable of a saved dataset."""
    ds = tsio.read_dataset(path)
    try:
        return tuple((str(n), str(v.attrs.get("long_name", n)), str(v.attrs.get("units", "")), tuple(map(str, v.dims)))
                     for n, v in ds.data_vars.items())
    finally:
        ds.close()


def _drawn_from(folder: Path, datasets: list[str], code: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Per dataset, the variables the figure's code names (quoted), as (name, long_name, units)."""
    out = []
    for nc in datasets:
        path = folder / nc
        if not path.is_file():
            continue
        used = [(n, ln, u) for n, ln, u, _ in _variables(str(path)) if _quoted(n).search(code)]
        if used:
            out.append((nc, used))
    return out


def _drawn_sentence(drawn) -> str:
    parts = []
    for nc, used in drawn:
        named = list(dict.fromkeys(f"{ln}{_units(u)}" for _, ln, u in used))
        shown = ", ".join(named[:6])
        more = f" and {len(named) - 6} more" if len(named) > 6 else ""
        parts.append(f"`{nc}`: {shown}{more}")
    return "Drawn from " + "; ".join(parts) + "." if parts else ""


def _draw_source(draw) -> str:
    """The source of a study's figure function (its ``FIGURES``), which the notebook's cell only calls."""
    import inspect

    try:
        return "\n" + inspect.getsource(draw) if draw is not None else ""
    except (OSError, TypeError):
        return ""


def figure_captions(info: registry.StudyInfo, folder: str | os.PathLike) -> dict[str, str]:
    """Caption per figure file of a study (every ``.png`` of its OUTPUTS), in MyST Markdown.

    The study module's ``CAPTIONS`` first, then the markdown cell before the code cell that draws the figure (the
    cell that names the file) in the executed notebook ``<folder>/<study>.ipynb``, then a sentence from the
    variables that cell reads; each ends with the datasets and variables the figure is drawn from."""
    folder = Path(folder)
    declared = dict(getattr(info.module, "CAPTIONS", {}) or {})
    datasets = [o for o in info.outputs if o.endswith(".nc")]
    notebook = folder / f"{info.name}.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"] if notebook.is_file() else []
    captions = {}
    for png in (o for o in info.outputs if o.endswith(".png")):
        text, code = declared.get(png, ""), ""
        last_markdown = ""
        for cell in cells:
            source = "".join(cell.get("source", ""))
            if cell.get("cell_type") == "markdown":
                last_markdown = source
            elif _quoted(png).search(source):
                code = source
                text = text or _markdown_caption(last_markdown)
                break
        drawn = _drawn_from(folder, datasets, code + _draw_source(info.figures.get(png)))
        if not text:
            variables = [f"{ln}{_units(u)}" for _, used in drawn for _, ln, u in used] or [
                f"{ln}{_units(u)}" for nc in datasets[:1] if (folder / nc).is_file()
                for _, ln, u, _ in _variables(str(folder / nc))[:4]]
            text = (f"**{variables[0][0].upper() + variables[0][1:]}**" + (
                f" with {', '.join(variables[1:4])}" if len(variables) > 1 else "") + f" ({info.name}).") \
                if variables else f"**A figure of the {info.name} study.**"
        captions[png] = " ".join([text, _drawn_sentence(drawn)]).strip()
    return captions


# ----------------------------------------------------------------------------- the model's accuracy

def _pct(value: float) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{100 * value:.1f}%"


def accuracy_rows(validation_nc: str | os.PathLike, cv: dict | None = None) -> list[dict]:
    """Per dataset of the validation study: runs, fitted, MAPE and worst error in the fit (fractions), and from the
    stored cross-validation the MAPE when the dataset is left out and when each run's size class is."""
    from ..model import catalog, validation
    from ..studies import validation as study

    cv = catalog.stored_cross_validation() if cv is None else cv
    left_out = cv.get("leave_one_dataset_out", {})
    size_out = validation.size_out_by_dataset(cv)
    ds = tsio.read_dataset(validation_nc)
    names = ds["dataset"].values
    rows = []
    for name in dict.fromkeys(names.tolist()):
        pick = names == name
        err = np.abs(ds["rel_error"].values[pick])
        err = err[np.isfinite(err)]
        sources = sorted(set(ds["source"].values[pick].tolist())) if "source" in ds else []
        rows.append({"dataset": name, "runs": int(pick.sum()), "fitted": bool(ds["fitted"].values[pick].any()),
                     "mape": float(err.mean()) if err.size else float("nan"),
                     "worst": float(err.max()) if err.size else float("nan"),
                     "left_out_mape": float(left_out[name]["mape"]) if name in left_out else float("nan"),
                     "left_out_worst": float(left_out[name]["worst"]) if name in left_out else float("nan"),
                     "size_out_mape": float(size_out[name]["mape"]) if name in size_out else float("nan"),
                     "target": float(study.TARGET_MAPE.get(name, study.DEFAULT_TARGET_MAPE)),
                     "sources": sources})
    ds.close()
    return rows


def accuracy_markdown(validation_nc: str | os.PathLike, cv: dict | None = None) -> str:
    """The accuracy table (one row per measured dataset) and what it says against the targets, as Markdown."""
    from ..model import catalog
    from ..studies import validation as study

    cv = catalog.stored_cross_validation() if cv is None else cv
    rows = accuracy_rows(validation_nc, cv)
    lines = ["| dataset | runs | fitted | MAPE | worst | target | MAPE when left out of the fit | worst left out "
             "| MAPE when each run's size class is left out |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['runs']:,} | {'yes' if r['fitted'] else 'no (held out)'} | "
                     f"{_pct(r['mape'])} | {_pct(r['worst'])} | ≤ {_pct(r['target'])} | {_pct(r['left_out_mape'])} | "
                     f"{_pct(r['left_out_worst'])} | {_pct(r['size_out_mape'])} |")
    judged = [r for r in rows if r["fitted"] and np.isfinite(r["left_out_mape"])]
    met = [r["dataset"] for r in judged if r["left_out_mape"] <= r["target"]]
    missed = [f"{r['dataset']} ({_pct(r['left_out_mape'])} against {_pct(r['target'])})" for r in judged
              if r["left_out_mape"] > r["target"]]
    held = [f"{r['dataset']} ({_pct(r['mape'])} against {_pct(r['target'])})" for r in rows if not r["fitted"]]
    worst = [f"{r['dataset']} ({_pct(r['worst'])})" for r in rows if r["worst"] > study.WORST_TARGET]
    sizes = cv.get("leave_one_size_out", {})
    text = [
        "\n".join(lines), "",
        f"Judged on the error when a dataset is left out of the fit: **{len(met)} of {len(judged)} fitted datasets "
        f"meet their target** ({', '.join(met) or 'none'})" + (f"; missed: {', '.join(missed)}." if missed else "."),
        f"Never fitted (held-out tests): {', '.join(held)}." if held else "",
        f"Runs worse than the worst-run target of {_pct(study.WORST_TARGET)}: {', '.join(worst)}." if worst else
        f"No run is worse than the worst-run target of {_pct(study.WORST_TARGET)}.",
        ("Leaving out a model-size class: " + ", ".join(f"{k} {_pct(float(v['mape']))} ({int(v['runs']):,} runs)"
                                                        for k, v in sizes.items()) + " MAPE.") if sizes else "",
    ]
    return "\n".join(t for t in text if t != "") + "\n"


def accuracy_substitutions(validation_nc: str | os.PathLike, cv: dict | None = None) -> dict[str, str]:
    """``{{ name }}`` values for the docs' hand-written pages (MyST substitutions): per dataset (dashes as
    underscores) ``worst_target``, ``mape_<d>``, ``worst_<d>``, ``left_out_<d>``, ``size_out_<d>``, ``runs_<d>``, ``target_<d>``."""
    from ..studies import validation as study

    out = {"worst_target": _pct(study.WORST_TARGET)}
    for r in accuracy_rows(validation_nc, cv):
        key = r["dataset"].replace("-", "_")
        out.update({f"mape_{key}": _pct(r["mape"]), f"worst_{key}": _pct(r["worst"]),
                    f"left_out_{key}": _pct(r["left_out_mape"]), f"size_out_{key}": _pct(r["size_out_mape"]),
                    f"runs_{key}": f"{r['runs']:,}", f"target_{key}": _pct(r["target"])})
    return out


# ----------------------------------------------------------------------------- generated pages

def _title(notebook: Path, fallback: str) -> str:
    if notebook.is_file():
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            if cell.get("cell_type") == "markdown":
                first = "".join(cell.get("source", "")).strip().splitlines()[:1]
                if first and first[0].startswith("# "):
                    return first[0][2:].strip()
    return fallback


def _figure_block(target: str, caption: str, name: str, alt: str) -> str:
    return f":::{{figure}} {target}\n:name: {name}\n:alt: {alt}\n:width: 100%\n\n{caption}\n:::\n"


def _alt(png: str) -> str:
    return png.removesuffix(".png").replace("_", " ")


def _dataset_table(folder: Path, datasets: list[str]) -> str:
    lines = ["| dataset | variable | long name | units | dims |", "|---|---|---|---|---|"]
    for nc in datasets:
        if (folder / nc).is_file():
            for name, long_name, units, dims in _variables(str(folder / nc)):
                shown = "" if units in ("1", "") else units
                lines.append(f"| `{nc}` | `{name}` | {long_name.replace('|', '/')} | {shown} | {', '.join(dims)} |")
    return "\n".join(lines)


def study_page(info: registry.StudyInfo, folder: str | os.PathLike) -> str:
    """The study's page (MyST Markdown): paper, verdicts, figures with captions, datasets, executed notebook."""
    folder = Path(folder)
    captions = figure_captions(info, folder)
    records = comparison.read_records(folder / comparison.RECORDS_FILE) \
        if (folder / comparison.RECORDS_FILE).is_file() else []
    tally = comparison.counts(records)
    datasets = [o for o in info.outputs if o.endswith(".nc")]
    parts = [f"({info.name})=", f"# {info.name}: {_title(folder / f'{info.name}.ipynb', info.name)}", "",
             f"**Paper:** {info.paper}", "",
             f"Notebook `{info.notebook}`, run by the workflow rule `{info.rule}`; its executed copy, outputs kept, is "
             f"[the notebook page]({info.name}/notebook.ipynb). Datasets and figures: `figures/{info.name}/`.", "",
             "## Paper vs ours", "",
             f"{len(records)} claims: {tally['reproduced']} reproduced, {tally['partly']} partly, "
             f"{tally['not reproduced']} not reproduced, {tally['not tested']} not tested "
             f"([the verdict rule](../verdicts.md)).", "",
             comparison.records_table(records) if records else "(no records)", "", "## Figures", ""]
    for png in (o for o in info.outputs if o.endswith(".png")):
        parts.append(_figure_block(f"{info.name}/{png}", captions[png], f"fig-{info.name}-{png[:-4]}", _alt(png)))
    parts += ["## Datasets", "", "Every variable with its `long_name` and `units` (blank: a pure number), "
              "as saved.", "", _dataset_table(folder, datasets), "", "```{toctree}", ":hidden:", "",
              f"{info.name}/notebook", "```", ""]
    return "\n".join(parts)


def _figure_output(png: str, caption: str, name: str) -> dict:
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/markdown": _figure_block(png, caption, name, _alt(png)), "text/plain": png}}


def notebook_page(info: registry.StudyInfo, folder: Path, captions: dict[str, str]) -> dict:
    """The executed notebook with each figure shown, as a captioned figure, by the cell that draws it (the
    published notebook links the PNG beside it; a notebook that only saves the figure shows it there too)."""
    nb = json.loads((folder / f"{info.name}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", ""))
        drawn = [png for png in captions if _quoted(png).search(source)]
        outputs = [o for o in cell.get("outputs", [])
                   if not any(f"]({png})" in "".join(o.get("data", {}).get("text/markdown", "")) for png in drawn)]
        cell["outputs"] = outputs + [_figure_output(png, captions[png], f"nb-{info.name}-{png[:-4]}") for png in drawn]
    return nb


def generate_sources(src: str | os.PathLike, figures_dir: str | os.PathLike = "figures",
                     config_path: str | os.PathLike = "config/config.yaml") -> list[Path]:
    """Write the generated pages into the build's source tree ``src`` (a copy of ``docs/``); returns them."""
    from . import verify

    src, figures_dir = Path(src), Path(figures_dir)
    written = []

    def write(rel: str, text: str) -> None:
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)

    names = study_names(config_path)
    infos = registry.load_all(names)
    for info in infos:
        folder = figures_dir / info.name
        missing = [o for o in info.all_outputs() if not (folder / o).exists()] + \
            ([f"{info.name}.ipynb"] if not (folder / f"{info.name}.ipynb").is_file() else [])
        if missing:
            raise DocsError(f"{folder}: {', '.join(missing)} missing (run the study: make figures)")
        (src / "studies" / info.name).mkdir(parents=True, exist_ok=True)
        for png in (o for o in info.outputs if o.endswith(".png")):
            shutil.copyfile(folder / png, src / "studies" / info.name / png)
        write(f"studies/{info.name}.md", study_page(info, folder))
        write(f"studies/{info.name}/notebook.ipynb",
              json.dumps(notebook_page(info, folder, figure_captions(info, folder)), indent=1))
    index = ["# The studies", "", "One page per study of the registry (`trainscale.studies.registry`), in the "
             "workflow's order: its paper, its paper-vs-ours records, every figure with its caption, the variables "
             "of its datasets and its executed notebook.", "", "| study | paper | claims | figures |",
             "|---|---|---|---|"]
    for info in infos:
        records = comparison.read_records(figures_dir / info.name / comparison.RECORDS_FILE)
        tally = comparison.counts(records)
        pngs = sum(o.endswith(".png") for o in info.outputs)
        index.append(f"| [{info.name}](studies/{info.name}.md) | {info.paper.replace('|', '/')} | "
                     f"{len(records)}: {tally['reproduced']} reproduced, {tally['partly']} partly, "
                     f"{tally['not reproduced']} not, {tally['not tested']} not tested | {pngs} |")
    index += ["", "```{toctree}", ":hidden:", ""] + [f"studies/{info.name}" for info in infos] + ["```", ""]
    write("studies.md", "\n".join(index))
    write(f"{GENERATED}/verdicts.md", verify.gallery_markdown(figures_dir, config_path) + "\n")
    validation_nc = figures_dir / "validation" / "validation.nc"
    write(f"{GENERATED}/accuracy.md", accuracy_markdown(validation_nc))
    write(f"{GENERATED}/substitutions.json", json.dumps(accuracy_substitutions(validation_nc), indent=1))
    return written


# ----------------------------------------------------------------------------- build

def build(out: str | os.PathLike = "results/docs/html", figures_dir: str | os.PathLike = "figures",
          config_path: str | os.PathLike = "config/config.yaml", docs_dir: str | os.PathLike = "docs",
          log=None) -> Path:
    """Build the site into ``out`` (through a temporary folder beside it, moved into place only after a build
    without warnings); returns ``out``. Raises DocsError with the first warnings otherwise."""
    out, docs_dir = Path(out).resolve(), Path(docs_dir)
    if not (docs_dir / "conf.py").is_file():
        raise DocsError(f"{docs_dir}: no conf.py (the docs' sources live in docs/ of the repository)")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        src = work / "src"
        shutil.copytree(docs_dir, src)
        generate_sources(src, figures_dir, config_path)
        html_dir, warnings = work / "html", work / "warnings.txt"
        env = dict(os.environ, MPLBACKEND="Agg")
        proc = subprocess.run([os.environ.get("TRAINSCALE_PYTHON", _python()), "-m", "sphinx", "-b", "html", "-q",
                               "-j", "1", "-d", str(work / "doctrees"), "-w", str(warnings), str(src), str(html_dir)],
                              env=env, capture_output=True, text=True, check=False)
        problems = warnings.read_text(encoding="utf-8").strip() if warnings.is_file() else ""
        if proc.returncode != 0 or problems:
            lines = (problems or proc.stderr.strip() or f"sphinx exited {proc.returncode}").splitlines()
            kept = out.parent / "warnings.txt"
            kept.write_text("\n".join(lines) + "\n", encoding="utf-8")
            raise DocsError(f"docs: sphinx reported {len(lines)} warning line(s), the site was not replaced "
                            f"(all in {kept}); first: {lines[0].replace(str(src) + os.sep, 'docs/')}")
        if out.exists():
            os.replace(out, work / "old")
        os.replace(html_dir, out)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _python() -> str:
    import sys

    return sys.executable


# ----------------------------------------------------------------------------- headless-browser check

def browser() -> str | None:
    """A Chromium on PATH (Debian's ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


_CHECK_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>site check</title></head><body>
<pre id="result">running</pre><script>
const pages = __PAGES__;
const problems = [], seenLinks = new Map();
let figures = 0, images = 0;
function load(url) {
  return new Promise(resolve => {
    const frame = document.createElement('iframe');
    frame.style.width = '1200px'; frame.style.height = '900px';
    frame.onload = () => resolve(frame);
    frame.src = url; document.body.appendChild(frame);
  });
}
async function imagesDone(doc) {
  await Promise.all([...doc.images].map(img => img.complete ? null :
    new Promise(r => { img.addEventListener('load', r); img.addEventListener('error', r); })));
}
async function checkPage(page) {
  const frame = await load(page);
  const doc = frame.contentDocument;
  if (!doc || !doc.body) { problems.push(page + ': does not load'); return; }
  await imagesDone(doc);
  for (const img of doc.images) {
    images += 1;
    if (!(img.naturalWidth > 0)) problems.push(page + ': image does not load: ' + img.getAttribute('src'));
  }
  const main = doc.querySelector('main') || doc.body;
  for (const img of main.querySelectorAll('img')) {
    if (!new URL(img.getAttribute('src') || '', doc.baseURI).pathname.includes('/_images/')) continue;  // theme icons
    const fig = img.closest('figure');
    const src = (img.getAttribute('src') || '').split('/').pop();
    const cap = fig ? (fig.querySelector('figcaption') || {}).textContent || '' : '';
    const text = cap.replace(/[\\s\\u00b6#]+/g, ' ').trim();
    if (!fig) problems.push(page + ': image outside a figure: ' + src);
    else if (!text || text === src || text === src.replace(/\\.png$/, '')) problems.push(page + ': figure without a caption: ' + src);
    else figures += 1;
  }
  for (const a of doc.querySelectorAll('a[href], link[href], script[src]')) {
    const raw = a.getAttribute('href') || a.getAttribute('src');
    if (/^(mailto:|javascript:|data:)/.test(raw)) continue;
    const url = new URL(raw, doc.baseURI);
    if (url.origin !== location.origin) continue;
    const key = url.origin + url.pathname;
    if (!seenLinks.has(key)) seenLinks.set(key, []);
    seenLinks.get(key).push([page, raw, url.hash]);
  }
  frame.remove();
}
(async () => {
  for (const page of pages) { await checkPage(page); }
  const idCache = new Map();
  for (const [key, uses] of seenLinks) {
    const resp = await fetch(key, {method: 'GET'});
    if (!resp.ok) { problems.push(uses[0][0] + ': broken link: ' + uses[0][1] + ' (' + resp.status + ')'); continue; }
    if (!key.endsWith('.html')) continue;
    const text = await resp.text();
    const ids = new Set([...new DOMParser().parseFromString(text, 'text/html').querySelectorAll('[id]')].map(e => e.id));
    for (const [page, raw, hash] of uses) {
      if (hash.length > 1 && !ids.has(decodeURIComponent(hash.slice(1))))
        problems.push(page + ': broken anchor: ' + raw);
    }
  }
  document.getElementById('result').textContent = JSON.stringify(
    {pages: pages.length, images, figures, links: seenLinks.size, problems});
})();
</script></body></html>"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D401 - keep the test output clean
        pass


@contextlib.contextmanager
def _serve(root: Path, check_page: str):
    class Handler(_QuietHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(root), **k)

        def do_GET(self):  # noqa: N802 - the checker page lives in memory, not in the site
            if self.path.startswith("/__check__.html"):
                body = check_page.encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def check_site(html_dir: str | os.PathLike, chromium: str | None = None, timeout_s: int = 300) -> dict:
    """Load every page of a built site in headless Chromium (served on localhost) and return
    ``{"pages", "images", "figures", "links", "problems"}``: problems name each link (or anchor) that does not
    resolve, each image that does not load, each figure without a caption (or captioned with its file name) and
    each content image outside a figure."""
    html_dir = Path(html_dir)
    chromium = chromium or browser()
    if chromium is None:
        raise DocsError("no Chromium on PATH (Debian: apt-get install chromium)")
    pages = sorted(p.relative_to(html_dir).as_posix() for p in html_dir.rglob("*.html")
                   if not p.relative_to(html_dir).as_posix().startswith(("_static/", "_sources/")))
    if not pages:
        raise DocsError(f"{html_dir}: no HTML pages (build the site first: make docs)")
    page = _CHECK_PAGE.replace("__PAGES__", json.dumps(["/" + p for p in pages]))
    with _serve(html_dir, page) as base, tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               f"--user-data-dir={profile}", "--virtual-time-budget=600000", "--dump-dom",
                               f"{base}/__check__.html"], capture_output=True, text=True, timeout=timeout_s, check=False)
    match = re.search(r'<pre id="result">(.*?)</pre>', proc.stdout, re.S)
    if proc.returncode != 0 or not match or match.group(1).strip() == "running":
        raise DocsError(f"chromium did not finish the check (exit {proc.returncode}): "
                        f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    import html as _html

    return json.loads(_html.unescape(match.group(1)))
