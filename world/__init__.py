"""The tiny offline shapes world: its text stack, pretraining, evaluation (the committed
world's path: ``common.paths.DEFAULT_WORLD``)."""
