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


def yaml_problem(e: Exception) -> str:
    """A YAML parser error as one line: what went wrong and where."""
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"
