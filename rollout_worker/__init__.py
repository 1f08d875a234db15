"""Rollouts: plan builders per algorithm, the batched tree engine, the Ray-free worker
core and the RolloutWorker actor around it."""
