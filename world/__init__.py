"""The tiny offline shapes world: its text stack, pretraining, evaluation."""

from ..common.paths import PROJECT_ROOT

# The committed default world (reproducible by `g2rpo pretrain`, see its world.json);
# package data in an installed g2rpo (see common/paths.py).
DEFAULT_WORLD = PROJECT_ROOT / "assets" / "shapes-world"
