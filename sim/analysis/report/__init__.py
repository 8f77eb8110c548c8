"""`moesim report`: strategy regression reports over result tables: the report itself
(`document`: best strategy per config, changes against a baseline, Markdown, the files), its
charts (`charts`) and the timelines of chosen cases (`timelines`)."""

from sim.analysis.report.document import Report, against, build, markdown, write

__all__ = ["Report", "against", "build", "markdown", "write"]
