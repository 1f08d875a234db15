"""What a run is prompted with: the shapes world's prompts and renderer, prompt files.

Imports ``common/errors.py`` and ``common/paths.py`` only."""
