"""The methods' math as pure functions: SDE/ODE steps and their log-probs, PPO-clip,
advantages, σ grids, rollout plans, seeds, CIs, FLOP counts.

Imports nothing of g2rpo but ``common/errors.py`` and ``common/paths.py``."""
