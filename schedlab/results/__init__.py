"""Results: what turns finished runs into numbers, files and pages.

A run's simulation ends in a :class:`RunResult` (``records``); everything here reads those
records and never runs a simulation:

* ``records`` -- :class:`RunResult`, :class:`Study`, :class:`ExperimentResults` (re-exported here);
* ``metrics`` -- a run's metrics from its per-request arrays; ``metric_names`` -- their names,
  so a misspelt one is refused when a file is loaded; ``stability`` -- is a run overloaded;
  ``compare`` -- simulated against a measured run;
* ``storage`` -- save a results folder's files and read them back; ``folder`` -- write that
  folder whole, then swap it into place; ``index_page`` -- its ``index.html``.

Importing the package imports ``records`` and what it needs (``metrics``, ``stability``), not the
modules that write files.
"""

from .records import ExperimentResults, RunResult, Study

__all__ = ["ExperimentResults", "RunResult", "Study"]
