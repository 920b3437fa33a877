"""Built-in reports: the summary ``table``, ``json`` results (with CSVs), ``plots`` and the seed ``lab`` artifacts."""

import schedlab

from .store import JsonReport
from .table import TableConfig, TableReport


@schedlab.hookimpl
def schedlab_register_reports(register):
    register("table", TableReport, config=TableConfig, help="summary table on stdout and in summary.txt")
    register("json", JsonReport, help="summary.json/.csv, requests.csv, timeline.csv and the resolved config")
