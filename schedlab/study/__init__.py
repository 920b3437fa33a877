"""Studies: *what* to run, kept apart from *where* it runs.

An experiment's studies (single runs, sweeps, searches, capacity plans, each possibly
replicated) become :class:`~schedlab.study.tasks.RunTask` objects -- one simulation each,
fully described by picklable data: the resolved tables, the seed and how to rebuild the
plugin catalog. :mod:`~schedlab.study.runner` decides which tasks to run and assembles their
results in file order; an :class:`~schedlab.study.executor.Executor` decides where they run:
in this process, in local worker processes (``--jobs N``) or on a Ray cluster
(``--backend ray``). Seeds come from the tasks, never from the worker, so every executor
gives identical results.

Modules: ``tasks`` (a run as data, executed anywhere), ``executor`` (in-process and local
processes), ``ray_backend`` (Ray, optional), ``runner`` (studies -> tasks -> results),
``speculative`` (searches that probe several values at once and answer like the sequential
search), ``replicas`` (derived seeds, confidence intervals, paired differences), ``planner``
(capacity planning over many dimensions).
"""
