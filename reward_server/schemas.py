"""Request and response models shared by the reward server and its client.

A score request is multipart/form-data: a ``request`` part holding ScoreRequest as
JSON, and the images as either one ``images`` safetensors file (tensor ``images``,
uint8 [N, H, W, 3]) or N PNG files, all named ``images``. Never pickle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer

SAFETENSORS_TYPE = "application/x-safetensors"
PNG_TYPE = "image/png"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreRequest(_Model):
    scorers: list[str] = Field(min_length=1, description="scorer names to run on every image")
    prompts: list[str] = Field(description="one prompt per image, in image order")
    request_id: str | None = Field(None, max_length=200, description="echoed back")
    embed: list[str] = Field(
        default_factory=list,
        description="scorers, among `scorers`, whose image embeddings to return too "
        "(reward_server/embeddings.py); empty: scores only",
    )

    @field_validator("scorers")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"scorer names must be distinct: {v}")
        return v

    @field_validator("embed")
    @classmethod
    def _among_scorers(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"scorer names must be distinct: {v}")
        scorers = info.data.get("scorers") or []
        if not set(v) <= set(scorers):  # routing picks replicas by `scorers`
            raise ValueError(f"{sorted(set(v) - set(scorers))} must be among scorers {scorers}")
        return v


class EmbeddingPayload(_Model):
    """One scorer's image embeddings: raw little-endian ``dtype`` bytes of an array of
    ``shape`` [N, D], base64 (D = 512-1024 in float16: 1-2 KB of an image)."""

    shape: list[int]
    dtype: Literal["float16"] = "float16"
    base64: str


class ScoreResponse(_Model):
    request_id: str | None = None
    scores: dict[str, list[float]] = Field(description="per scorer, one score per image")
    versions: dict[str, str]
    cached: dict[str, int] = Field(description="per scorer, images answered from the cache")
    timings_ms: dict[str, float] = Field(description="decode, per-scorer wait+score, total")
    replica: str
    embeddings: dict[str, EmbeddingPayload] | None = Field(
        None, description="per scorer named in the request's `embed`; absent when none was"
    )

    @model_serializer(mode="wrap")
    def _embeddings_when_asked(self, handler):
        # a score-only answer is as before embeddings existed: a client of then (its
        # model forbids extra keys) reads it
        data = handler(self)
        if isinstance(data, dict) and data.get("embeddings") is None:
            data.pop("embeddings", None)
        return data


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
