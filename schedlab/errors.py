"""Errors a user can cause and fix. The CLI prints them as one message, without a traceback."""

from __future__ import annotations


class SchedlabError(Exception):
    """Base class: something the user can fix (bad input, unknown name, impossible config)."""


class ConfigError(SchedlabError):
    """An experiment file, a ``--set`` override or a plugin config is wrong."""


class UnknownPluginError(ConfigError):
    """A ``kind`` names nothing registered; the message lists what is."""


class DuplicateNameError(SchedlabError):
    """Two plugins registered the same name for the same kind."""


class WorkloadError(SchedlabError):
    """A request file or trace cannot be read or has bad values."""


class SimulationError(SchedlabError):
    """The simulation cannot go on: a plugin broke a rule, or no progress is possible."""


class StallError(SimulationError):
    """Work is left but nothing can make progress (a scheduler that never admits, a storm)."""
