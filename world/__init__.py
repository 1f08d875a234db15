"""The tiny offline shapes world: its text stack, pretraining, evaluation."""
