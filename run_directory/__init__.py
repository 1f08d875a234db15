"""A run directory's files: metrics rows, evaluations, checkpoints, sample grids and
curves (read by the orchestrator, `g2rpo eval`, `compare` and `report`)."""
