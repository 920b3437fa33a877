"""Studies: what to run, from the experiment file to every simulation, kept apart from *where* it runs.

An experiment file (:mod:`~schedlab.study.experiment`) becomes studies (single runs, sweeps,
searches, capacity plans, each possibly replicated), and they become
:class:`~schedlab.study.tasks.RunTask` objects -- one simulation each, fully described by
picklable data: the resolved tables, the seed and how to rebuild the plugin catalog.
:mod:`~schedlab.study.runner` decides which tasks to run and assembles their results in file
order; an :class:`~schedlab.study.executor.Executor` decides where they run: in this process,
in local worker processes (``--jobs N``) or on a Ray cluster (``--backend ray``). Seeds come
from the tasks, never from the worker, so every executor gives identical results.

Modules, from the file down to one run:

* ``experiment`` -- read and validate a TOML experiment into studies; ``overrides`` -- dotted
  keys, ``--set`` and ``[[runs]]`` merging; ``sweep`` -- ``[sweep]`` grids; ``search`` -- the
  SLO-first search and its constraints; ``spec`` -- a study as data and the run of each point;
* ``runner`` (studies -> tasks -> results), ``drivers`` (how each study asks for runs),
  ``speculative`` (searches that probe several values at once and answer like the sequential
  search), ``replicas`` (derived seeds, confidence intervals, paired differences), ``planner``
  (capacity planning over many dimensions);
* ``tasks`` (a run as data, executed anywhere), ``executor`` (in-process and local processes),
  ``ray_backend`` (Ray, optional), ``simulation`` (assemble one run from its tables and simulate it).
"""
