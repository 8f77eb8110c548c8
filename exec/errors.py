"""Executor errors: user-facing, printed by the CLI as one line (see sim.core.errors)."""

from __future__ import annotations

from sim.core.errors import MoesimError


class ExecError(MoesimError):
    """A run on real devices failed: a timeout, a dead peer, a graph the executor cannot run.

    The message names the rank and, where one is involved, the task, its kind and its peers.
    """


class TorchMissingError(ExecError):
    """torch (or torch.distributed) is not installed; the executor needs it."""


def require_torch() -> None:
    """Fail with a clear one-line error instead of an ImportError traceback."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError as e:
        raise TorchMissingError(
            f"the executor needs torch with torch.distributed ({e}); install a build that "
            "matches your hardware, e.g. `pip install torch==2.13.0`"
        ) from None
    if not dist.is_available():
        raise TorchMissingError("this torch build has no torch.distributed support")
