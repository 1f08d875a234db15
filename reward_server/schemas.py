"""Request and response models shared by the reward server and its client.

A score request is multipart/form-data: a ``request`` part holding ScoreRequest as
JSON, and the images as either one ``images`` safetensors file (tensor ``images``,
uint8 [N, H, W, 3]) or N PNG files, all named ``images``. Never pickle.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

SAFETENSORS_TYPE = "application/x-safetensors"
PNG_TYPE = "image/png"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreRequest(_Model):
    scorers: list[str] = Field(min_length=1, description="scorer names to run on every image")
    prompts: list[str] = Field(description="one prompt per image, in image order")
    request_id: str | None = Field(None, max_length=200, description="echoed back")

    @field_validator("scorers")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"scorer names must be distinct: {v}")
        return v


class ScoreResponse(_Model):
    request_id: str | None = None
    scores: dict[str, list[float]] = Field(description="per scorer, one score per image")
    versions: dict[str, str]
    cached: dict[str, int] = Field(description="per scorer, images answered from the cache")
    timings_ms: dict[str, float] = Field(description="decode, per-scorer wait+score, total")
    replica: str


class ScorerInfo(_Model):
    name: str
    version: str
    max_batch: int


class ScorersResponse(_Model):
    scorers: list[ScorerInfo]


class HealthResponse(_Model):
    status: str
    replica: str


class ErrorResponse(_Model):
    detail: str
    field: str | None = None
