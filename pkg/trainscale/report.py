"""One static HTML page with every study's figures, their captions, the paper-vs-ours table and the model's
accuracy table, built from the committed outputs alone (``make report`` -> ``results/report.html``).

The page is self-contained (figures embedded), so it can be mailed or opened from a file system. A figure's
caption is the text of the notebook cell that introduces it, taken from the executed notebook published beside
the figures (``figures/<study>/<study>.ipynb``), so caption and figure come from the same run.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from pathlib import Path

import numpy as np

from . import comparison
from . import io as tsio
from .studies import registry
from .verify import study_names

__all__ = ["build_report", "figure_captions", "accuracy_rows"]

_LINK = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")


def figure_captions(notebook: str | os.PathLike) -> dict[str, str]:
    """Caption per figure file: the markdown cell before the code cell whose output shows the figure."""
    path = Path(notebook)
    if not path.is_file():
        return {}
    nb = json.loads(path.read_text(encoding="utf-8"))
    captions, last_markdown = {}, ""
    for cell in nb.get("cells", []):
        source = "".join(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            last_markdown = source.strip()
            continue
        for output in cell.get("outputs", []):
            text = output.get("data", {}).get("text/markdown", "")
            text = "".join(text) if isinstance(text, list) else text
            for name in _LINK.findall(text):
                captions.setdefault(name, last_markdown)
    return captions


def accuracy_rows(validation_nc: str | os.PathLike) -> list[dict]:
    """Per dataset of the validation study: runs, whether fitted, MAPE and worst error (in %)."""
    ds = tsio.read_dataset(validation_nc)
    rows = []
    datasets = ds["dataset"].values
    for name in dict.fromkeys(datasets.tolist()):
        pick = datasets == name
        err = np.abs(ds["rel_error"].values[pick])
        err = err[np.isfinite(err)]
        fitted = bool(ds["fitted"].values[pick].any()) if "fitted" in ds else False
        rows.append({"dataset": name, "runs": int(pick.sum()), "fitted": fitted,
                     "mape_pct": 100 * float(err.mean()) if err.size else float("nan"),
                     "worst_pct": 100 * float(err.max()) if err.size else float("nan")})
    return rows


def _markdownish(text: str) -> str:
    """Escape, then the two inline marks the notebooks use (bold, code)."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return out.replace("\n\n", "<br><br>")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _number(value: float) -> str:
    return "–" if not np.isfinite(value) else f"{value:.3g}"


_STYLE = """
body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
figure{margin:1.5em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:13px;color:#444}
.reproduced{color:#176417}.partly{color:#8a5a00}.not-reproduced{color:#a11}.not-tested{color:#666}
"""

_CHECK = """
<script>
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('figure img');
  var ok = 0;
  imgs.forEach(function (img) { if (img.complete && img.naturalWidth > 0) { ok += 1; } });
  document.body.setAttribute('data-figures', String(imgs.length));
  document.body.setAttribute('data-figures-loaded', String(ok));
});
</script>
"""


def build_report(figures_dir: str | os.PathLike = "figures", config_path: str | os.PathLike = "config/config.yaml",
                 out: str | os.PathLike = "results/report.html") -> Path:
    """Write the report page (temporary name, then moved into place); returns its path."""
    figures_dir, out = Path(figures_dir), Path(out)
    names = study_names(config_path)
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainscale report</title>",
             f"<style>{_STYLE}</style></head><body><h1>trainscale: every study, its figures and its paper</h1>"]
    records = []
    for name in names:
        path = figures_dir / name / comparison.RECORDS_FILE
        if path.is_file():
            records.extend(comparison.read_records(path))
    tally = comparison.counts(records)
    parts.append(f"<h2>Paper vs ours</h2><p>{len(records)} claims: {tally['reproduced']} reproduced, "
                 f"{tally['partly']} partly, {tally['not reproduced']} not reproduced, and {tally['not tested']} not "
                 f"tested, counted apart (verdict rule: "
                 f"<code>trainscale.comparison.judge</code>).</p>")
    parts.append(_table(
        ["study", "quantity", "paper (setting)", "ours (setting)", "same setting", "verdict"],
        [[html.escape(r.study), html.escape(r.quantity),
          f"{_number(r.paper_value)} {html.escape(r.units)}<br><small>{html.escape(r.paper_setting)}</small>",
          f"{_number(r.our_value)} {html.escape(r.units)}<br><small>{html.escape(r.our_setting)}</small>",
          "yes" if r.same_setting else "no",
          f"<span class='{r.verdict.replace(' ', '-')}'><b>{r.verdict}</b></span>: {html.escape(r.reason)}"]
         for r in records]))
    validation_nc = figures_dir / "validation" / "validation.nc"
    if validation_nc.is_file():
        rows = accuracy_rows(validation_nc)
        parts.append("<h2>How right the performance model is</h2>")
        parts.append(_table(["dataset", "runs", "fitted on", "MAPE %", "worst %"],
                            [[html.escape(r["dataset"]), str(r["runs"]), "yes" if r["fitted"] else "no (held out)",
                              _number(r["mape_pct"]), _number(r["worst_pct"])] for r in rows]))
    for info in registry.load_all(names):
        folder = figures_dir / info.name
        captions = figure_captions(folder / f"{info.name}.ipynb")
        parts.append(f"<h2 id='{info.name}'>{html.escape(info.name)}</h2><p>{html.escape(info.paper)}</p>")
        for output in info.outputs:
            if not output.endswith(".png"):
                continue
            png = folder / output
            if not png.is_file():
                parts.append(f"<p>missing figure {html.escape(str(png))} (run make figures)</p>")
                continue
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            caption = captions.get(output) or output
            parts.append(f"<figure><img alt='{html.escape(output)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{_markdownish(caption)}<br><small>{html.escape(str(png))}</small>"
                         f"</figcaption></figure>")
    parts.append(_CHECK + "</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    os.replace(tmp, out)
    return out
