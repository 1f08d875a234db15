"""The small training setting the Ray and learner tests share (quick world, 32-px
images, a 6-step grid); a test file appends only what it changes."""

SMALL_RUN = [
    "sampling.num_steps=6",
    "sampling.sde_steps=[0,1]",
    "sampling.granularities=[1,2]",
    "sampling.group_size=4",
    "sampling.prompts_per_worker=2",
    "train.workers=2",
    "train.image_size=32",
    "train.max_sequence_length=16",
    "train.eval_every=1",
    "train.eval_samples=8",
    "train.checkpoint_every=1",
    "optim.lr=1e-4",
    "rewards=[{name: shapes_clip}]",
]
