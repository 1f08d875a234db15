"""Every knob of a run as pydantic models (``G2RPOConfig`` in ``run.py``), loaded from YAML
with ``a.b=c`` overrides (``loading.py``), and the guard's defaults by image size.

May import ``common/algorithms`` and ``common/prompts``; nothing else of common/."""
