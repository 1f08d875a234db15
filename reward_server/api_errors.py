"""The one shape every refused request is answered in, ErrorResponse
``{"detail", "field"}``: ``ApiError`` (what the handlers and their dependencies raise),
the description of pydantic/FastAPI validation errors, and the exception handlers
reward_server/app.py installs to turn each refusal into that shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .schemas import ErrorResponse
from .scorers.base import BadInput
from .wire import TooLarge


class ApiError(HTTPException):
    """A request refused with ``status_code``; ``field`` names the part at fault."""

    def __init__(
        self,
        status_code: int,
        detail: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status_code, detail, headers)
        self.field = field


def error_response(
    status: int, detail: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorResponse(detail=detail, field=field).model_dump()
    return JSONResponse(body, status_code=status, headers=headers)


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds {limit} bytes", "body")


def _field_of(message: str) -> str | None:
    """``images[3]: ...`` names the field ``images``; a message without one names none."""
    head = message.split(":", 1)[0]
    return head.split("[", 1)[0] if head and " " not in head else None


_SOURCES = {"body", "query", "header", "path", "cookie"}


def describe_errors(errors: Sequence[Any], prefix: str | None = None) -> tuple[str, str]:
    """Pydantic/FastAPI error entries as (detail, field of the first): each ``loc``
    without FastAPI's ``body``/``query``/... head, or under ``prefix`` when given."""
    named = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ())]
        if prefix is not None:
            loc = [prefix, *loc]
        elif loc and loc[0] in _SOURCES and len(loc) > 1:
            loc = loc[1:]
        named.append((".".join(loc) or "body", error.get("msg", "invalid")))
    if not named:
        return "invalid request", prefix or "body"
    return "; ".join(f"{field}: {msg}" for field, msg in named), named[0][0]


async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    field = getattr(exc, "field", None) or ("body" if exc.status_code == 400 else None)
    return error_response(exc.status_code, str(exc.detail), field, exc.headers)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail, field = describe_errors(exc.errors())
    return error_response(422, detail, field)


async def on_bad_input(request: Request, exc: BadInput) -> JSONResponse:
    return error_response(422, str(exc), _field_of(str(exc)))


async def on_too_large(request: Request, exc: TooLarge) -> JSONResponse:
    return error_response(413, str(exc), _field_of(str(exc)) or "images")
