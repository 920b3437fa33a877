"""``index.html``: one self-contained page per results folder -- the table, the settings, every plot.

Open it from the file system; it needs no server and no other file: the PNGs of ``plots/``
are embedded as ``data:`` URIs, the table is the summary table's text, and the settings are
the experiment's tables and each run's resolved tables as JSON. Links to the folder's other
files (CSV, JSON) are relative, so they work where the folder is.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from pathlib import Path
from typing import Any

from .folder import GENERATOR_TAG, INDEX
from .storage import atomic_write, jsonable

PLOTS = "plots"
#: Plots are shown in the plots report's order of kinds (then by name): overviews first.
PLOT_ORDER = ("latency_cdf", "compare", "sweep_", "search_", "timeline_")

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 13px; line-height: 1.35; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-family: monospace; color: #555; }
nav a { margin-right: 1em; }
"""


def render(results, *, table_text: str, plots: list[tuple[str, bytes]], files: list[str],
           experiment_settings: dict | None, run_settings: dict[str, Any]) -> str:
    """The page's HTML.

    :param plots: ``(file name, PNG bytes)`` in the order to show them.
    :param files: the folder's other files, linked by relative name.
    :param experiment_settings: the experiment file's tables (None when not known).
    :param run_settings: run name -> its resolved tables.
    """
    e = html.escape
    name = results.name
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        GENERATOR_TAG,
        f"<title>schedlab: {e(name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{e(name)}</h1>",
    ]
    description = ((experiment_settings or {}).get("experiment") or {}).get("description")
    if isinstance(description, str) and description:
        parts.append(f"<p>{e(description)}</p>")
    if results.source:
        parts.append(f"<p>Experiment file: <code>{e(str(results.source))}</code></p>")
    parts.append('<nav><a href="#table">table</a><a href="#plots">plots</a><a href="#settings">settings</a>'
                 '<a href="#files">files</a></nav>')
    parts.append(f'<h2 id="table">Table</h2><pre id="summary-table">{e(table_text)}</pre>')
    parts.append(f'<h2 id="plots">Plots ({len(plots)})</h2>')
    if not plots:
        parts.append("<p>No plots in this folder (run without <code>--no-plots</code>, or "
                     "<code>schedlab plot</code> the folder).</p>")
    for filename, png in plots:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(filename)}">'
                     f"<figcaption>{e(filename)}</figcaption></figure>")
    parts.append('<h2 id="settings">Settings</h2>')
    if experiment_settings is not None:
        parts.append("<details open><summary>The experiment file's tables</summary>"
                     f'<pre id="experiment-settings">{e(_json(experiment_settings))}</pre></details>')
    parts.append(f"<details{' open' if len(run_settings) <= 4 else ''}><summary>Each run's resolved tables "
                 f"({len(run_settings)} runs)</summary>"
                 f'<pre id="run-settings">{e(_json(run_settings))}</pre></details>')
    parts.append('<h2 id="files">Files</h2><ul>')
    parts += [f'<li><a href="{e(f)}">{e(f)}</a></li>' for f in files]
    parts.append("</ul></body></html>")
    return "\n".join(parts) + "\n"


def write(out_dir: str | os.PathLike, results, *, table_text: str, experiment_settings: dict | None,
          run_settings: dict[str, Any]) -> Path:
    """Write ``index.html`` into ``out_dir`` from the files there now (see :data:`PLOT_ORDER`)."""
    out = Path(out_dir)
    folder = out / PLOTS
    pngs = sorted(folder.glob("*.png"), key=_plot_rank) if folder.is_dir() else []
    plots = [(p.name, p.read_bytes()) for p in pngs]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                   if p.is_file() and p.name != INDEX and not p.name.startswith(".") and p.parent != folder)
    files += [f"{PLOTS}/{p.name}" for p in pngs]
    text = render(results, table_text=table_text, plots=plots, files=files,
                  experiment_settings=experiment_settings, run_settings=run_settings)
    path = out / INDEX
    atomic_write(path, text)
    return path


_SETTINGS = re.compile(r'<pre id="experiment-settings">(.*?)</pre>', re.DOTALL)


def saved_experiment_settings(out_dir: str | os.PathLike) -> dict | None:
    """The experiment file's tables as the folder's ``index.html`` shows them (``schedlab plot``
    redraws the page from a results folder, which keeps them nowhere else), or None."""
    try:
        page = (Path(out_dir) / INDEX).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = _SETTINGS.search(page)
    if found is None:
        return None
    try:
        settings = json.loads(html.unescape(found.group(1)))
    except ValueError:
        return None
    return settings if isinstance(settings, dict) else None


def _plot_rank(path: Path) -> tuple[int, str]:
    rank = next((i for i, prefix in enumerate(PLOT_ORDER) if path.name.startswith(prefix)), len(PLOT_ORDER))
    return rank, path.name


def _json(value) -> str:
    return json.dumps(jsonable(value), indent=1, ensure_ascii=False)
