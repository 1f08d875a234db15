"""The g2rpo Grafana dashboard, as code (grafanalib). Regenerate the JSON Grafana
imports with

    .venv/bin/python deploy/grafana/dashboard.py > deploy/grafana/g2rpo.json

A test checks that the committed JSON is this file's output, and runs every panel's
query against a real Prometheus scraping a real reward server and training run."""

from __future__ import annotations

import json
import sys

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    RowPanel,
    Target,
    Template,
    Templating,
    TimeSeries,
)

PROM = "${datasource}"
WIDTH, HEIGHT = 8, 8  # three panels a row


def _panel(title: str, queries: list[tuple[str, str]], unit: str = "", **kw) -> TimeSeries:
    return TimeSeries(
        title=title,
        dataSource=PROM,
        targets=[
            Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i))
            for i, (expr, legend) in enumerate(queries)
        ],
        unit=unit,
        **kw,
    )


TRAINING = [
    _panel("Reward per reward model", [("g2rpo_train_reward", "{{reward}}")]),
    _panel(
        "Reward per granularity",
        [("g2rpo_train_reward_by_granularity", "{{reward}} g={{granularity}}")],
    ),
    _panel("Held-out evaluation", [("g2rpo_train_eval_reward", "{{reward}}")]),
    _panel(
        "Advantage",
        [
            ("g2rpo_train_advantage", "{{stat}}"),
            ("g2rpo_train_advantage_share", "share {{reward}}"),
        ],
    ),
    _panel(
        "PPO ratio and clip fraction",
        [("g2rpo_train_ratio", "ratio {{stat}}"), ("g2rpo_train_clip_fraction", "clipped")],
    ),
    _panel(
        "Loss and gradient norm",
        [("g2rpo_train_loss", "loss"), ("g2rpo_train_grad_norm", "grad norm (pre-clip)")],
    ),
    _panel("Model evaluations per second", [("g2rpo:train_model_evaluations:rate5m", "NFE/s")]),
    _panel(
        "Iteration time split",
        [('g2rpo_train_phase_seconds{phase!="iteration"}', "{{phase}}")],
        unit="s",
        stacking={"mode": "normal", "group": "A"},
        fillOpacity=40,
    ),
    _panel(
        "Weights: version, push time, time since the last iteration",
        [
            ("g2rpo_train_weight_version", "version"),
            ('g2rpo_train_phase_seconds{phase="weight_push"}', "push s"),
            ("g2rpo:train_seconds_since_last_iteration", "s since last iteration"),
        ],
    ),
]

HACKING = [
    _panel("Image health of the held-out samples", [("g2rpo_train_eval_health", "{{measure}}")]),
    _panel(
        "Image health: paired change since the first evaluation (95% CI)",
        [("g2rpo_train_eval_health_change", "{{measure}} {{bound}}")],
    ),
    _panel(
        "Reward drift and the guard",
        [
            ("g2rpo_train_eval_drift_diverging", "trained up, held-out down"),
            ('g2rpo_train_eval_reward_change{bound="mean"}', "change {{reward}}"),
            ("g2rpo_train_guard", "guard {{stat}}"),
        ],
    ),
]

REWARD_SERVERS = [
    _panel("Requests per second by status", [("g2rpo:reward_requests:rate1m", "{{status}}")]),
    _panel(
        "Request latency",
        [
            ("g2rpo:reward_request_duration_seconds:p50_5m", "p50"),
            ("g2rpo:reward_request_duration_seconds:p99_5m", "p99"),
        ],
        unit="s",
    ),
    _panel("Images scored per second", [("g2rpo:reward_images_scored:rate1m", "{{scorer}}")]),
    _panel(
        "Batch size (images per scorer call)", [("g2rpo:reward_batch_size:mean5m", "{{scorer}}")]
    ),
    _panel(
        "Queue and load",
        [
            ("g2rpo:reward_queue_depth:sum", "queued {{scorer}}"),
            ("g2rpo:reward_inflight_per_replica:avg", "in flight per replica"),
        ],
    ),
    _panel(
        "Cache hits and errors",
        [
            ("g2rpo:reward_cache_hits:ratio_rate5m", "cache hits {{scorer}}"),
            ("g2rpo:reward_request_errors:ratio_rate5m", "error ratio"),
        ],
        unit="percentunit",
    ),
    _panel("Live replicas", [("g2rpo:reward_replicas_up:sum", "up")]),
]


def _laid_out(rows: list[tuple[str, list[TimeSeries]]]) -> list:
    panels, y = [], 0
    for title, members in rows:
        panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        for i, panel in enumerate(members):
            panel.gridPos = GridPos(h=HEIGHT, w=WIDTH, x=(i % 3) * WIDTH, y=y + (i // 3) * HEIGHT)
            panels.append(panel)
        y += -(-len(members) // 3) * HEIGHT
    return panels


def dashboard() -> Dashboard:
    return Dashboard(
        title="g2rpo: training and reward servers",
        uid="g2rpo-overview",
        description="Granular-GRPO training runs and their reward-server replicas",
        tags=["g2rpo"],
        timezone="browser",
        refresh="30s",
        templating=Templating(
            list=[
                Template(
                    name="datasource",
                    label="Prometheus",
                    query="prometheus",
                    type="datasource",
                )
            ]
        ),
        panels=_laid_out(
            [
                ("Training", TRAINING),
                ("Reward hacking", HACKING),
                ("Reward servers", REWARD_SERVERS),
            ]
        ),
    ).auto_panel_ids()


def dashboard_json() -> str:
    return json.dumps(dashboard().to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True)


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query on the dashboard."""
    return [(p.title, t.expr) for p in TRAINING + HACKING + REWARD_SERVERS for t in p.targets]


if __name__ == "__main__":
    sys.stdout.write(dashboard_json() + "\n")
