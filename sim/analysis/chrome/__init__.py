"""Chrome trace JSON of a run, read exactly by ui.perfetto.dev and chrome://tracing: the
document (`document`: a process per rank, a thread per stream, slices in integer
nanoseconds) and what it shows besides the tasks (`tracks`: dependency arrows, link
utilisation and memory counters)."""

from sim.analysis.chrome.document import Layout, chrome_trace, layout, write_chrome_trace
from sim.analysis.chrome.tracks import counter_events, flow_events

__all__ = [
    "Layout",
    "chrome_trace",
    "counter_events",
    "flow_events",
    "layout",
    "write_chrome_trace",
]
