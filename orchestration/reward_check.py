"""Before any model loads: every scorer a run needs has a reward replica that serves it.

A run with external replicas (``train.reward.urls``, ``train.reward.redis_url`` or
``--redis-url``) and none of its own would otherwise start every actor, load the
models, roll out, and only then find that nobody scores its images (a bare
``NoReplicaAvailable`` after the client's deadline). Replicas starting beside the run
(an autoscaler, a user's other terminal) are waited for a little."""

from __future__ import annotations

import sys
import time

import httpx

from ..common.cluster.redis_access import RedisPassword, connect_redis
from ..common.errors import RunFailed
from ..reward_server.tls import client_verify, untrusted_server, unverified_certificate

WAIT_S = 60.0  # replicas registering a little after the run starts


def served_by_urls(
    urls: list[str], token: str | None, ca_file: str | None = None
) -> tuple[set[str], list[str]]:
    """The scorers the replicas at ``urls`` serve (``GET /v1/scorers``), and a line
    for each that did not answer. An https:// replica whose certificate ``ca_file``
    (train.reward.tls_ca_file) does not verify is an error at once, not a wait."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = client_verify(ca_file)
    served, unreachable = set(), []
    for url in urls:
        try:
            answer = httpx.get(
                f"{url.rstrip('/')}/v1/scorers", headers=headers, timeout=10.0, verify=verify
            )
            answer.raise_for_status()
            served |= {s["name"] for s in answer.json()["scorers"]}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            reason = unverified_certificate(exc)
            if reason is not None:
                raise untrusted_server(url, reason) from None
            unreachable.append(f"{url} ({type(exc).__name__}: {str(exc)[:120]})")
    return served, unreachable


def served_in_redis(
    redis_url: str, password: RedisPassword | None = None
) -> tuple[set[str], list[str]]:
    """The scorers of the replicas registered in ``redis_url``, and a line if Redis
    did not answer (a refused password raises RedisAuthError)."""
    import redis

    from ..reward_server.discovery import live_replicas

    try:
        client = connect_redis(redis_url, password, socket_timeout=5.0)
        replicas = live_replicas(client)
        client.close()
    except redis.RedisError as exc:
        return set(), [f"Redis {redis_url} ({type(exc).__name__}: {exc})"]
    return {name for r in replicas for name in r.scorers}, []


def check_scorers_served(
    scorers: list[str],
    urls: list[str],
    redis_url: str | None,
    token: str | None,
    wait_s: float = WAIT_S,
    redis_password: RedisPassword | None = None,
    ca_file: str | None = None,
) -> None:
    """RunFailed naming ``train.reward`` and each scorer no replica serves, after
    waiting up to ``wait_s`` for replicas still starting."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        served, problems = served_by_urls(urls, token, ca_file)
        if redis_url:
            found, trouble = served_in_redis(redis_url, redis_password)
            served |= found
            problems += trouble
        missing = [s for s in scorers if s not in served]
        if not missing:
            return
        if time.monotonic() >= deadline:
            break
        if not said:
            print(
                f"waiting up to {wait_s:.0f} s for a reward replica serving {missing}",
                file=sys.stderr,
            )
            said = True
        time.sleep(2.0)
    where = [f"train.reward.urls {urls}"] if urls else []
    where += [f"Redis {redis_url}"] if redis_url else []
    raise RunFailed(
        f"train.reward: no reward replica serves {missing} (looked at {' and '.join(where)}; "
        f"they serve {sorted(served) or 'nothing'}"
        + (f"; not answering: {'; '.join(problems)}" if problems else "")
        + "). Start one (`g2rpo reward-server --scorers NAME=DIR --redis-url URL`), or let "
        "the job start its own (train.reward.replicas: 1, train.reward.scorers: [NAME=DIR])"
    )
