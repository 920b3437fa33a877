"""Built-in reports: the summary ``table``, ``json`` results (with CSVs), ``plots``, ``crossover``, ``goodput``
per GPU, Perfetto ``trace`` files, ``request_log`` files (what ``vllm_log`` replays), the ``fleet`` day hour
by hour and the seed ``lab`` artifacts."""

import schedlab

from .crossover import CrossoverConfig
from .fleet import FleetConfig
from .goodput import GoodputConfig, GoodputReport
from .lab import LabConfig, LabReport
from .measured import CompareConfig, CompareReport
from .plot_config import PlotsConfig
from .request_log import RequestLogConfig, RequestLogReport
from .store import JsonReport
from .table import TableConfig, TableReport
from .trace import TraceConfig, TraceReport


def _plots_report(config=None):
    """The plots report; matplotlib is imported only when plots are drawn."""
    from .plots import PlotsReport

    return PlotsReport(config)


def _fleet_report(config=None):
    """The fleet report; matplotlib is imported only when its figure is drawn."""
    from .fleet import FleetReport

    return FleetReport(config)


def _crossover_report(config):
    """The crossover report; matplotlib is imported only when its figure is drawn."""
    from .crossover import CrossoverReport

    return CrossoverReport(config)


@schedlab.hookimpl
def schedlab_register_reports(register):
    register("fleet", _fleet_report, config=FleetConfig,
             help="a day of a fleet: GPU-hours, cost and SLO attainment per hour (fleet.txt, plots/fleet.png)")
    register("table", TableReport, config=TableConfig, help="summary table on stdout and in summary.txt")
    register("json", JsonReport, help="summary.json/.csv, requests.csv, timeline.csv and the resolved config")
    register("plots", _plots_report, config=PlotsConfig,
             help="PNG figures in plots/: latency CDFs, timelines, sweep metrics, search probes, run comparisons")
    register("compare", CompareReport, config=CompareConfig,
             help="runs replaying a measured run or with a [target] summary: simulated vs measured tables "
                  "(compare.txt), CDF and timeline plots")
    register("crossover", _crossover_report, config=CrossoverConfig,
             help="where each sweep stops beating a baseline sweep as load grows: crossover.txt/.csv, "
                  "plots/crossover.png")
    register("goodput", GoodputReport, config=GoodputConfig,
             help="DistServe's goodput per GPU from sweeps over the request rate: goodput.txt, plots/goodput.png")
    register("trace", TraceReport, config=TraceConfig,
             help="traces/<run>.json: Chrome / Perfetto trace events -- iterations as slices, request spans, "
                  "KV and queue counters")
    register("request_log", RequestLogReport, config=RequestLogConfig,
             help="logs/<run>.jsonl: each run as a vLLM per-request log (the file vllm_log replays): a run "
                  "of known settings as a calibration target")
    register("lab", LabReport, config=LabConfig,
             help="seed 001's artifacts: static.txt, compare.txt, maxseqs.txt, queue.csv, cost.txt, tune.txt")
