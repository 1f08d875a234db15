"""G2rpoRewardCollapse end to end, without a training run: the driver's evaluation
entries (records.eval_row: the paired change since iteration 0 and its 95% CI) from
real per-sample scores, exported by a real TrainingExporter scraped over HTTP, under
the alert's expression. The alert's own timing (``for``) is promtool's unit test
(deploy/prometheus/rules/alerts_test.yml, run by tests/test_monitoring.py)."""

import re
from pathlib import Path

import httpx
import numpy as np
import yaml
from g2rpo.orchestration.telemetry import TrainingExporter
from g2rpo.run_directory.eval_rows import eval_row

RULES = Path(__file__).parents[1] / "deploy" / "prometheus" / "rules" / "alerts.yml"
PROMPTS, PER_PROMPT = 8, 4  # 32 held-out samples, as a small run evaluates


def _collapse_rule() -> dict:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == "G2rpoRewardCollapse"]
    return rule


def _first(scores: dict) -> dict:
    """An evaluation record as the driver keeps it (evals/it_00000.json)."""
    return {
        "prompts": [f"p{i}" for i in range(PROMPTS)],
        "scores": {k: list(v) for k, v in scores.items()},
    }


def _row(iteration: int, first: dict, later: dict) -> dict:
    row = {"iteration": iteration, "version": iteration, "loss": 0.0, "grad_norm": 0.0}
    row |= {"clip_fraction": 0.0, "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    row |= {"nfe": 0}
    values = {k: np.asarray(v, np.float64) for k, v in later.items()}
    return row | eval_row(values, _first(first), PER_PROMPT)


def _scrape(exporter: TrainingExporter) -> dict[tuple[str, str], float]:
    """{(reward, bound): value} of the change gauge, from the exporter's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10).text
    pattern = r'^g2rpo_train_eval_reward_change\{bound="(\w+)",reward="([^"]+)"\} (\S+)$'
    return {(m[2], m[1]): float(m[3]) for m in re.finditer(pattern, text, re.M)}


def _firing(prometheus, expr: str, version: int) -> list[str]:
    """The rewards for which ``expr`` holds, once Prometheus scraped the row of
    weight version ``version``."""
    import time

    deadline = time.monotonic() + 30
    while not prometheus.query(f"g2rpo_train_weight_version == {version}"):
        assert time.monotonic() < deadline, "Prometheus did not scrape the exporter"
        time.sleep(0.2)
    return sorted(r["metric"]["reward"] for r in prometheus.query(expr))


def test_noise_at_a_low_pass_rate_stays_quiet_and_a_real_collapse_does_not(tmp_path):
    """1 of 32 samples passing at iteration 0, none later: the best-so-far rule saw a
    100% fall; the paired change's CI still reaches 0, so the alert's condition
    (upper bound < 0) holds for no series in a real Prometheus scraping a real
    exporter. Every prompt's reward falling is a collapse: the whole CI lies below
    0 and the condition holds (for 30 minutes it fires: alerts_test.yml)."""
    from servers import PrometheusServer

    rule = _collapse_rule()
    assert "g2rpo_train_eval_reward_change" in rule["expr"] and 'bound="hi"' in rule["expr"]
    rng = np.random.default_rng(0)
    passed = np.zeros(PROMPTS * PER_PROMPT)
    passed[5] = 1.0
    clip = 0.3 + 0.02 * rng.standard_normal(PROMPTS * PER_PROMPT)
    first = {"shapes_oracle/pass": passed, "shapes_clip": clip}
    none_pass = np.zeros_like(passed)
    noise = _row(1, first, {"shapes_oracle/pass": none_pass, "shapes_clip": clip})
    collapsed = _row(2, first, {"shapes_oracle/pass": none_pass, "shapes_clip": clip - 0.2})
    exporter = TrainingExporter(0)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "g2rpo-train",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{exporter.port}"],
                                "labels": {"run": "r"},
                            }
                        ],
                    }
                ],
            }
        )
    )
    prometheus = PrometheusServer(config, tmp_path / "data")
    try:
        exporter.observe(noise)
        got = _scrape(exporter)
        assert got[("shapes_oracle/pass", "mean")] == -1 / 32
        assert got[("shapes_oracle/pass", "lo")] < 0 <= got[("shapes_oracle/pass", "hi")]
        assert got[("shapes_clip", "hi")] == 0.0  # unchanged
        assert _firing(prometheus, rule["expr"], 1) == []

        exporter.observe(collapsed)
        got = _scrape(exporter)
        assert abs(got[("shapes_clip", "mean")] + 0.2) < 1e-9
        assert got[("shapes_clip", "hi")] < 0
        assert got[("shapes_oracle/pass", "hi")] >= 0
        assert _firing(prometheus, rule["expr"], 2) == ["shapes_clip"]
    finally:
        prometheus.stop()
        exporter.close()
