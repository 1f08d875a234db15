"""The reward servers' bearer token: what one must be before a server starts on it.

A token guards /v1/* (scoring, the scorer list) of every replica that holds it; a
placeholder left in a manifest (``change-me``) or a short one is one anybody who can
reach the port can guess, so a server refuses to start on either, and so does the
training driver before any actor starts."""

from __future__ import annotations

import re

from ..common.errors import UsageError

MIN_TOKEN_BYTES = 32
HOW_TO_MAKE = "make one with `openssl rand -hex 32`"
# Words a placeholder is made of; a token built only of these (and separators or
# digits) was typed by a person, not drawn at random.
PLACEHOLDER_WORDS = (
    "changeme",
    "change",
    "me",
    "token",
    "secret",
    "password",
    "passwd",
    "test",
    "dummy",
    "example",
    "placeholder",
    "default",
    "replace",
    "insert",
    "your",
    "here",
    "todo",
    "fixme",
    "reward",
    "g2rpo",
    "redis",
    "key",
    "admin",
    "server",
    "for",
    "the",
    "my",
)
_WORDS = re.compile("|".join(sorted(PLACEHOLDER_WORDS, key=len, reverse=True)))


def token_problem(token: str) -> str | None:
    """Why ``token`` is unfit for a reward server (placeholder or short), or None. Pure:
    the token itself never appears in the answer."""
    lowered = token.lower()
    compact = re.sub(r"[\s\-_.:/]+", "", lowered)
    if len(set(lowered)) == 1:
        return f"is one character repeated ({len(token)} times), a placeholder"
    if compact and not re.sub(r"[0-9]", "", _WORDS.sub("", compact)):
        return "is a placeholder (made of words such as change-me, token, secret, test)"
    size = len(token.encode("utf-8"))
    if size < MIN_TOKEN_BYTES:
        return f"is {size} bytes, under the {MIN_TOKEN_BYTES} bytes a reward token needs"
    return None


def check_token(token: str, source: str) -> None:
    """UsageError naming ``source`` (where the token came from: ``--token-env VAR``,
    ``train.reward.token_env VAR``) when the token is unfit."""
    problem = token_problem(token)
    if problem is not None:
        raise UsageError(f"{source}: the reward token {problem}; {HOW_TO_MAKE}")
