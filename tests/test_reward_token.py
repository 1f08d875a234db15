"""The reward token: a placeholder or a short one is refused by the server's command and by
the training driver before any actor starts, each naming where the token came from and
how to make one. (At 3bb9114 any non-empty token was served: `change-me`, the deploy
Secret's placeholder, guarded the replicas of every cluster that kept it.)"""

import os
import secrets
import subprocess

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import G2RPOError
from g2rpo.reward_server.security import token_problem
from g2rpo.reward_server.settings import ScorerSpec, ServerSettings
from servers import G2RPO

PLACEHOLDERS = [
    "change-me",
    "CHANGEME",
    "Change_Me-change_me-change_me-change_me",  # long, but still a placeholder
    "placeholder-token-for-the-reward-server-2024",
    "test_token_1234567890123456789012345678",
    "x" * 48,  # one character repeated
    "secret",
    "password",
    "dummy",
    "example",
]


@pytest.mark.parametrize("token", PLACEHOLDERS)
def test_placeholders_are_named_as_such(token):
    problem = token_problem(token)
    assert problem is not None and "placeholder" in problem


def test_short_tokens_are_named_by_their_size_and_random_ones_pass():
    assert token_problem(secrets.token_hex(15) + "z") == (
        "is 31 bytes, under the 32 bytes a reward token needs"
    )
    # what the docs tell users to run (openssl rand -hex 32), and the job's own tokens
    assert all(token_problem(secrets.token_hex(32)) is None for _ in range(200))
    assert all(token_problem(secrets.token_urlsafe(32)) is None for _ in range(200))
    assert token_problem(secrets.token_hex(16)) is None  # 32 hex characters: 32 bytes


def test_settings_refuse_an_unfit_token_as_a_last_guard():
    with pytest.raises(ValueError, match=r"--token-env, or train\.reward\.token_env"):
        ServerSettings(scorers=[ScorerSpec(name="jpeg_compressibility")], token="change-me")


def _reward_server(token: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [G2RPO, "reward-server", "--scorers", "jpeg_compressibility", "--token-env", "RS_TOKEN"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "RS_TOKEN": token},
    )


def test_the_server_command_refuses_a_placeholder_and_a_short_token():
    res = _reward_server("change-me")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("g2rpo: error: --token-env RS_TOKEN: the reward token is a placeholder")
    assert "openssl rand -hex 32" in line and "change-me" in line  # the word list, not the value
    short = secrets.token_hex(10)
    res = _reward_server(short)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "--token-env RS_TOKEN: the reward token is 20 bytes, under the 32 bytes" in line
    assert "openssl rand -hex 32" in line and short not in line


@pytest.mark.parametrize(
    ("token", "needle"),
    # a fixed random-looking token: test ids stay the same in every collection
    [("change-me", "is a placeholder"), ("5f1c0a9e3b7d2468", "is 16 bytes")],
    ids=["placeholder", "short"],
)
def test_the_driver_refuses_an_unfit_token_before_any_actor(monkeypatch, token, needle):
    """RewardSource reads train.reward.token_env first thing (no actor is started: the
    run's replicas are external here, and no Ray is running)."""
    from g2rpo.reward_server.replicas import RewardSource

    monkeypatch.setenv("G2RPO_TEST_REWARD_TOKEN", token)
    cfg = load_config(
        None,
        [
            "train.reward.urls=[http://127.0.0.1:9]",
            "train.reward.token_env=G2RPO_TEST_REWARD_TOKEN",
        ],
    )
    with pytest.raises(G2RPOError) as err:
        RewardSource(cfg, None)
    message = str(err.value)
    assert message.startswith("train.reward.token_env G2RPO_TEST_REWARD_TOKEN: the reward token")
    assert needle in message and "openssl rand -hex 32" in message
    assert needle != "is 16 bytes" or token not in message  # a real token is never echoed
