"""Every Redis client the project makes is built here (``connect_redis``): the reward
servers' registration, heartbeat and shared score cache, the clients' discovery, the
driver's run status, ``g2rpo status`` and the start-up check of served scorers.

Redis is the control plane: whoever can write to it can register a replica, and every
worker then sends its images and the reward token to that replica's URL. A Redis
password (``requirepass``) is read from an environment variable whose NAME the config or
a flag gives (``train.reward.redis_password_env``, ``--redis-password-env``); the value
travels in memory only (RewardEndpoints to the Ray actors), never in a URL, a config file
or a log line. A password refused or missing is a configuration error named
as such (``RedisAuthError``), not a Redis outage: redis-py's own AuthenticationError is a
ConnectionError, which every caller here tolerates as "Redis away, carry on"."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError, G2RPOError, UsageError

CONFIG_FIELD = "train.reward.redis_password_env"
FLAG = "--redis-password-env"


class RedisAuthError(G2RPOError, RuntimeError):
    """Redis refused this client's credentials (or wanted some): a setting to fix,
    never retried or waited out as an outage."""


@dataclass(frozen=True)
class RedisPassword:
    """A Redis password and the environment variable it was read from (named in errors;
    the value never is: not in repr, not in messages)."""

    value: str = field(repr=False)
    env: str


def redis_password(env: str | None, source: str = CONFIG_FIELD) -> RedisPassword | None:
    """The password in environment variable ``env`` (None: no password); ``source``
    (``train.reward.redis_password_env`` or ``--redis-password-env``) names where ``env``
    was given, in the error when it is unset or empty."""
    if env is None:
        return None
    value = os.environ.get(env)
    if not value:
        error = UsageError if source.startswith("--") else ConfigError
        raise error(
            f"{source} {env}: the environment variable is unset or empty; export the Redis "
            f"password in it (in Kubernetes: from the Secret redis-password, key password)"
        )
    return RedisPassword(value, env)


def _auth_problem(url: str, password: RedisPassword | None, said: str) -> RedisAuthError:
    """What Redis's refusal ``said`` means for this client, as a setting to change."""
    if password is None:
        return RedisAuthError(
            f"Redis at {url} requires a password: set {CONFIG_FIELD} (or {FLAG}) to the env "
            "var holding it"
        )
    return RedisAuthError(
        f"Redis at {url} refused the password in {password.env} ({said}): put the password "
        f"Redis requires there ({CONFIG_FIELD}, {FLAG} name the variable)"
    )


def _checked_connection_class(base, url: str, password: RedisPassword | None):
    """``base`` (redis-py's connection class for the URL's scheme) whose responses turn
    an authentication refusal, on connecting (AUTH) or on any command (NOAUTH), into
    RedisAuthError."""
    import redis

    class CheckedConnection(base):
        def read_response(self, *args, **kwargs):
            try:
                return super().read_response(*args, **kwargs)
            except redis.AuthenticationError as exc:
                # not a RedisError: redis-py's connect would keep this socket, unauthenticated
                self.disconnect()
                raise _auth_problem(url, password, str(exc)) from None

    return CheckedConnection


def connect_redis(
    url: str,
    password: RedisPassword | None = None,
    *,
    socket_timeout: float = 2.0,
    socket_connect_timeout: float | None = None,
):
    """A redis.Redis for ``url`` authenticating with ``password``. It connects on first
    use; then a refused or missing password raises RedisAuthError, an unreachable Redis
    redis-py's ConnectionError/TimeoutError as before. A URL holding a password is
    refused: URLs are printed (status lines, errors, Redis registrations)."""
    import redis
    from redis.connection import parse_url

    parts = urlsplit(url)
    if parts.password is not None:
        raise UsageError(
            f"the Redis URL {parts.scheme}://...@{parts.hostname} holds credentials: give the "
            f"password through an env var named by {CONFIG_FIELD} (or {FLAG}) instead, since "
            "URLs are printed"
        )
    base = parse_url(url).get("connection_class", redis.Connection)
    return redis.Redis.from_url(
        url,
        password=password.value if password is not None else None,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        connection_class=_checked_connection_class(base, url, password),
    )


def check_redis_password(url: str, password: RedisPassword | None) -> None:
    """RedisAuthError now when Redis at ``url`` refuses ``password`` (or wants one); a
    Redis that does not answer is left to its callers, which carry on without it."""
    import redis

    client = connect_redis(url, password)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError):
        pass
    finally:
        client.close()
