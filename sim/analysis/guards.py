"""Guards of a run before and after its work: how much the cost model multiplies it, flows
simulated one by one, and a summary that must hold only finite numbers."""

from __future__ import annotations

from typing import Any


def jitter_replicas(costs: Any) -> int:
    """Whole simulations the cost model asks for (jitter replicas; 1 without jitter)."""
    return costs.jitter.replicas if costs.jitter is not None else 1


def check_flows(lim: Any, graph: Any, costs: Any, source: str) -> None:
    """Skewed all-to-alls are simulated flow by flow: bound how many before the run."""
    from sim.core.limits import skewed_flows

    n = skewed_flows(graph, per_flow=costs.fidelity == "flow" and costs.network == "flow")
    if costs.network == "flow":
        lim.check(
            "max_skewed_flows",
            n,
            f"{source}: flows simulated one by one (skewed all-to-alls; finish_rtol or a "
            "uniform routing make them cheaper)",
        )


def finite_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary, once checked to hold no NaN or infinity (an error names the key)."""
    from sim.core.finite import check_finite

    check_finite(summary, "summary")
    return summary
