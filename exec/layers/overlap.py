"""Communication streams on threads beside the caller's compute stream, for the real layer's
overlapping strategies (pipelined, MPipeMoE, FasterMoE).

Each comm stream runs on its own thread; the caller's thread is the compute stream. Threads
hand chunks to each other through `threading.Event`s and wait on them with `Overlap.wait`,
which gives up when another thread failed: the first failure is re-raised on the compute
thread once every comm thread stopped, and no thread is left blocked (never a hang).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import torch

POLL_S = 0.05  # how often a blocked thread looks for an abort from another stream


class Aborted(Exception):
    """Another thread of the layer failed; this one stops quietly."""


class Overlap:
    """One run of comm streams and a compute stream (`run`), sharing an abort flag."""

    def __init__(self, name: str) -> None:
        self.name = name  # threads are named NAME:STREAM
        self.abort = threading.Event()
        self.errors: list[BaseException] = []

    def wait(self, event: threading.Event) -> None:
        """Block until `event` is set; raise `Aborted` if another thread failed meanwhile."""
        while not event.wait(POLL_S):
            if self.abort.is_set():
                raise Aborted

    def run(
        self,
        streams: Iterable[str],
        comm: Callable[[str], None],
        compute: Callable[[], None],
    ) -> None:
        """`comm(stream)` on a thread per stream, `compute()` on this one; re-raise the first
        failure of any of them."""
        # Autograd's grad mode and torch's thread count are per thread: the comm threads
        # take the caller's, so their ops record (or not) the graph as the caller's would.
        grad_mode, n_threads = torch.is_grad_enabled(), torch.get_num_threads()

        def comm_stream(stream: str) -> None:
            torch.set_grad_enabled(grad_mode)
            torch.set_num_threads(n_threads)
            try:
                comm(stream)
            except Aborted:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised by the compute thread
                self.errors.append(e)
                self.abort.set()

        threads = [
            threading.Thread(target=comm_stream, args=(s,), name=f"{self.name}:{s}", daemon=True)
            for s in streams
        ]
        for th in threads:
            th.start()
        try:
            compute()
        except Aborted:
            pass
        except BaseException:
            self.abort.set()
            raise
        while any(th.is_alive() for th in threads) and not self.abort.is_set():
            for th in threads:
                th.join(POLL_S)
        if self.errors:
            raise self.errors[0]
