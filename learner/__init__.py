"""Learning: advantages, the GRPO update, the learner group (FSDP2 / data parallel),
checkpoints, and the Learner actor around the Ray-free core."""
