"""The executed notebook, published next to a study's figures for readers.

Papermill's executed notebook (the rule's log) records wall-clock times (when each cell started and
ended, how long it took), which would make every rerun change the file. :func:`publish_notebook` writes a
copy without them, outputs kept, so ``figures/<study>/<study>.ipynb`` shows the study's comparison and
prints without running anything and a rerun rewrites the same bytes. An embedded image that is one of the
PNG files beside it is replaced by a link to that file (the figure is committed once, not twice), and the
random element ids of rich HTML outputs (xarray's repr) are renumbered in order of appearance. The workflow
runs a notebook into a staging folder and moves its outputs into place afterwards
(:mod:`trainscale.interface.workflow_outputs`); ``shown_as`` writes the place they end up in wherever the copy names the
staging folder (the injected ``output_dir``, the paths the notebook printed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from pathlib import Path

__all__ = ["publish_notebook"]

# Per-notebook and per-cell metadata that hold times, durations or the machine's environment.
_NOTEBOOK_DROP = ("start_time", "end_time", "duration", "environment_variables")
_CELL_DROP = ("execution",)
_CELL_PAPERMILL_DROP = ("start_time", "end_time", "duration")


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _renumber_ids(text: str, seen: dict[str, str]) -> str:
    """Replace each random UUID by a stable one (the same UUID keeps the same replacement)."""
    def stable(match):
        return seen.setdefault(match.group(0), f"00000000-0000-0000-0000-{len(seen):012d}")

    return _UUID.sub(stable, text)


def _png_names(folder: Path) -> dict[str, str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in sorted(folder.glob("*.png"))}


def _link_known_images(outputs: list, pngs: dict[str, str]) -> list:
    kept = []
    for output in outputs:
        data = output.get("data", {})
        encoded = data.get("image/png")
        if encoded is not None:
            raw = base64.b64decode("".join(encoded) if isinstance(encoded, list) else encoded)
            name = pngs.get(hashlib.sha256(raw).hexdigest())
            if name is not None:
                kept.append({"output_type": "display_data", "metadata": {},
                             "data": {"text/markdown": f"![{name}]({name})", "text/plain": name}})
                continue
        kept.append(output)
    return kept


def publish_notebook(executed: str | os.PathLike, destination: str | os.PathLike,
                     shown_as: tuple[str, str] | None = None) -> Path:
    """Copy an executed notebook to ``destination`` without timestamps (temporary name, then moved);
    ``shown_as=(staging, final)`` replaces the folder ``staging`` by ``final`` in the copy's text."""
    executed, destination = Path(executed), Path(destination)
    nb = json.loads(executed.read_text(encoding="utf-8"))
    papermill = nb.get("metadata", {}).get("papermill", {})
    for key in _NOTEBOOK_DROP:
        papermill.pop(key, None)
    pngs = _png_names(destination.parent)
    ids: dict[str, str] = {}
    for cell in nb.get("cells", []):
        metadata = cell.get("metadata", {})
        for key in _CELL_DROP:
            metadata.pop(key, None)
        for key in _CELL_PAPERMILL_DROP:
            metadata.get("papermill", {}).pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = _link_known_images(cell.get("outputs", []), pngs)
            for output in cell["outputs"]:
                html = output.get("data", {}).get("text/html")
                if html is not None:
                    text = "".join(html) if isinstance(html, list) else html
                    output["data"]["text/html"] = _renumber_ids(text, ids)
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp = destination.with_name(f".{destination.name}.tmp")
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if shown_as is not None:
        staging, final = (str(Path(folder)) for folder in shown_as)
        text = text.replace(staging, final)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, destination)
    return destination
