"""Is the run still making good images: the image-health measures, diversity in a
scorer's embedding, and the guard that reads them at each evaluation.

May import ``common/config`` and those below it."""
