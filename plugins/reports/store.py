"""The ``json`` report: summary.json, summary.csv, requests.csv, timeline.csv and config.json."""

from __future__ import annotations

from schedlab.results.storage import save


class JsonReport:
    """Saves everything ``schedlab plot`` and later analysis need (see schedlab.results.storage)."""

    def __init__(self, config=None):
        self.config = config

    def write(self, results, out_dir):
        return save(results, out_dir)
