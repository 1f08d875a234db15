"""The tiny offline shapes world: its text stack, pretraining, evaluation."""

from pathlib import Path

# The committed default world (reproducible by `g2rpo pretrain`, see its world.json).
DEFAULT_WORLD = Path(__file__).resolve().parents[1] / "assets" / "shapes-world"
