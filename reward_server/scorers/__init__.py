"""Scorers: images + prompts → one float per image, each with a name and version."""
