"""Link utilisation per link class over time: what a trace's counter tracks show.

Rates only change when the network re-solves them, so sampling the link loads after each
solve gives the exact piecewise-constant utilisation. Per class two numbers: the aggregate
(bytes/s carried by all links of the class over their total capacity) and the busiest link's
share of its capacity. Sampling costs a pass over the links per solve, so it runs only when
asked for (`FlowNetwork.record`): a plain simulation does not pay for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ClassTimeline:
    """Samples of (time, mean utilisation per class, busiest link's utilisation per class)."""

    def __init__(
        self, link_classes: list[str], cap: np.ndarray, weight: np.ndarray | None = None
    ) -> None:
        # weight: how many links of the whole cluster each simulated link stands for (a
        # symmetric run loads one link per orbit; the others carry the same and are empty)
        self.names = list(dict.fromkeys(link_classes))
        index = {n: i for i, n in enumerate(self.names)}
        self.cls = np.fromiter((index[c] for c in link_classes), np.int64, len(link_classes))
        self.cap = np.asarray(cap, dtype=float)
        w = np.ones(len(self.cap)) if weight is None else np.asarray(weight, dtype=float)
        self.weight = w
        full = np.bincount(self.cls, weights=self.cap * w, minlength=len(self.names))
        self.capacity = np.where(full > 0, full, np.inf)  # a class with no links stays at 0
        self.order = np.argsort(self.cls, kind="stable")
        sorted_cls = self.cls[self.order]
        self.starts = np.searchsorted(sorted_cls, np.arange(len(self.names)))
        self.present = np.bincount(self.cls, minlength=len(self.names)) > 0
        self.t: list[float] = []
        self.mean: list[np.ndarray] = []
        self.max: list[np.ndarray] = []

    def sample(self, t: float, usage: np.ndarray) -> None:
        """The loads (bytes/s per link) in force from time `t` on."""
        # float with weights (the stubs type bincount as integer whatever its arguments)
        mean: np.ndarray = np.bincount(
            self.cls, weights=usage * self.weight, minlength=len(self.names)
        )
        mean /= self.capacity
        share = (usage / self.cap)[self.order]
        top = np.zeros(len(self.names))
        if len(share):
            top[self.present] = np.maximum.reduceat(share, self.starts[self.present])
        if self.t and t <= self.t[-1]:  # a second solve at one instant: the last one holds
            self.mean[-1], self.max[-1] = mean, top
            return
        if self.t and np.array_equal(mean, self.mean[-1]) and np.array_equal(top, self.max[-1]):
            return
        self.t.append(t)
        self.mean.append(mean)
        self.max.append(top)

    def as_dict(self) -> dict[str, Any]:
        """{"classes": names, "t": [T] seconds, "mean": [T, C], "max": [T, C]} (fractions)."""
        c = len(self.names)
        return {
            "classes": self.names,
            "t": np.asarray(self.t, dtype=float),
            "mean": np.asarray(self.mean, dtype=float).reshape(-1, c),
            "max": np.asarray(self.max, dtype=float).reshape(-1, c),
        }
