"""Whole training steps of real models at production layouts: `moesim predict` (a table of
runs, `predict.py`) and `moesim plan` (the fastest layout, `plan.py`), built from the kernels
of each layer (`ops.py`, `kernels.py`), the collectives on the topology (`comm.py`,
`layout.py`), Megatron-Core's pipeline schedules (`pipeline.py`, `stages.py`) and the memory
of a step (`memory.py`); the recipes the published runs used are data (`recipes.yaml`)."""
