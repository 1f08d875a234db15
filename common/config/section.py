"""The base of every config section: unknown keys are errors, assignments validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors; assignments are validated (shared by every section)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
