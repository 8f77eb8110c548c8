"""User-facing errors. The CLI prints these as one line and exits non-zero, no traceback."""


class MoesimError(Exception):
    """Base class: a mistake in the user's input, reported with what was expected."""


class ConfigError(MoesimError):
    """An invalid run configuration; the message names the field."""


class GraphError(MoesimError):
    """An invalid task graph; the message names the task or collective."""


class TopologyError(MoesimError):
    """An impossible or malformed topology."""


class DeadlockError(MoesimError):
    """The simulation stopped with tasks left that can never run."""
