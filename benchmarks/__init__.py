"""`g2rpo bench ...`: rollout engine, learner, reward server, weight push and
precision benchmarks, each a measured ratio or rate in one run."""
