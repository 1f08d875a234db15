"""deploy/prometheus and deploy/grafana against the real thing: promtool checks the
config and rules and runs the alerts' unit tests; Debian's Prometheus, started with
deploy/'s scrape config (file_sd targets pointed at loopback, intervals shortened to
1 s), scrapes a real reward server and a real ``g2rpo train`` run that scores through
it; then every dashboard panel's query and every recording rule must return series.
The run is a background ``g2rpo compare``'s (SIGINT ignored, as a script's ``&`` leaves
it), stopped by SIGTERM: compare passes it on once, the run checkpoints its last
iteration and says how to resume, and both exit 143 (common/cluster/stopping.py)."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from g2rpo.common.config.loading import dump_config, load_config
from servers import G2RPO, PrometheusServer, RewardServerProcess, session_ray_env
from small_run import SMALL_RUN, assert_stopped_with_checkpoint

DEPLOY = Path(__file__).parents[1] / "deploy"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool: .ci/run installs prometheus")


def _dashboard():
    sys.path.insert(0, str(DEPLOY / "grafana"))
    try:
        import dashboard
    finally:
        sys.path.pop(0)
    return dashboard


def _promtool(*args):
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=DEPLOY)


def test_promtool_accepts_the_config_and_rules_and_the_alert_tests_pass():
    config = _promtool("check", "config", "prometheus/prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    rules = _promtool(
        "check", "rules", "prometheus/rules/recording.yml", "prometheus/rules/alerts.yml"
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    tests = _promtool("test", "rules", "prometheus/rules/alerts_test.yml")
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr
    # every alert has a unit test
    alerts = yaml.safe_load((DEPLOY / "prometheus/rules/alerts.yml").read_text())
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    tested = (DEPLOY / "prometheus/rules/alerts_test.yml").read_text()
    assert all(f"alertname: {n}" in tested for n in names), names


def test_the_committed_dashboard_is_the_generators_output():
    committed = (DEPLOY / "grafana/g2rpo.json").read_text()
    assert committed == _dashboard().dashboard_json() + "\n", (
        "regenerate: .venv/bin/python deploy/grafana/dashboard.py > deploy/grafana/g2rpo.json"
    )
    panels = json.loads(committed)["panels"]
    assert sum(p["type"] == "timeseries" for p in panels) == 19


def _recording_rules() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus/rules/recording.yml").read_text())
    return [r["record"] for g in rules["groups"] for r in g["rules"]]


@pytest.mark.slow
def test_every_panel_query_and_recording_rule_has_series_from_a_real_scrape(
    ray_local, world, tmp_path
):
    prom_dir = tmp_path / "prometheus"
    shutil.copytree(DEPLOY / "prometheus", prom_dir)
    config = (prom_dir / "prometheus.yml").read_text()
    (prom_dir / "prometheus.yml").write_text(
        config.replace("interval: 15s", "interval: 1s").replace(
            "refresh_interval: 30s", "refresh_interval: 1s"
        )
    )
    for f in (prom_dir / "targets").glob("*.json"):
        f.unlink()
    reward = RewardServerProcess(
        "--scorers", f"shapes_clip={world / 'shapes_clip'},shapes_oracle", quiet=True
    )
    (prom_dir / "targets/reward.json").write_text(
        json.dumps([{"targets": [f"127.0.0.1:{reward.port}"], "labels": {"replica": "r1"}}])
    )
    prometheus = PrometheusServer(prom_dir / "prometheus.yml", tmp_path / "data")
    overrides = [
        *SMALL_RUN,
        f"model.pretrained={world / 'pipeline'}",
        "train.workers.count=1",  # one process fewer to start than SMALL_RUN's two
        "train.eval.on_actor=false",  # and one more: the held-out evaluation on the worker
        # every iteration evaluated, so the paired changes since iteration 0 (rewards,
        # image health, drift) and the guard's gauges have series; at this step size the
        # fp32 weights cannot move (AdamW's step ~1e-12 is far below a weight's ulp), so
        # every change is exactly 0 with a CI of [0, 0]: the healthy-run check below does
        # not depend on the world's low strict pass rate over few samples
        # (tests/test_reward_collapse_alert.py covers that noise)
        "train.eval.every=1",
        "optim.lr=1e-12",
        "train.guard.action=stop",
        "train.metrics.port=0",
        f"train.reward.urls=[{reward.url}]",
    ]
    # the run is started as a script would start a comparison in the background:
    # `g2rpo compare` (SIGINT ignored, as a non-interactive shell's `&` leaves it), its
    # one run a `g2rpo train` process of its own joining the tests' local Ray
    base = load_config(DEPLOY.parent / "configs/tiny.yaml", overrides)
    (tmp_path / "base.yaml").write_text(dump_config(base))
    (tmp_path / "spec.yaml").write_text(f"""
name: watched
output_dir: {tmp_path / "compare"}
base_config: {tmp_path / "base.yaml"}
seeds: [0]
methods: {{monitored: {{label: G2RPO}}}}
budget: {{iterations: 200}}
eval: {{splits: [held_out], prompts_per_split: 4, samples_per_prompt: 2}}
""")
    run_dir = tmp_path / "compare" / "watched" / "runs" / "monitored-s0"
    cmd = [G2RPO, "compare", str(tmp_path / "spec.yaml"), "--no-progress"]
    compare = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=session_ray_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    run = None  # the run's `g2rpo train`, in a session of its own
    queries = [*_dashboard().panel_queries(), *(("recording rule", r) for r in _recording_rules())]
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "metrics_port").is_file():
            assert compare.poll() is None, compare.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.5)
        (run,) = psutil.Process(compare.pid).children()
        port = int((run_dir / "metrics_port").read_text())
        (prom_dir / "targets/train.json").write_text(
            json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"run": "monitored"}}])
        )
        # a repeated request: the cache-hit series exist only after a hit
        from g2rpo.reward_server.client import RewardClient

        images = np.zeros((2, 32, 32, 3), np.uint8)
        with RewardClient([reward.url]) as client:
            for _ in range(2):
                client.score(images, ["a red circle on a blue background"] * 2, ["shapes_clip"])
        missing = {e: t for t, e in queries}
        while missing and time.monotonic() < deadline:
            assert compare.poll() is None, (run_dir / "train.log").read_text()[-3000:]
            for expr in list(missing):
                if prometheus.query(expr):
                    del missing[expr]
            time.sleep(1.0)
        assert not missing, f"no series for: {missing}"
        # the alerts are loaded, and a healthy run fires none of them
        rules = prometheus.query("ALERTS")
        assert rules == [], rules
        # stopped as `ray job stop` or Kubernetes stops it, before the browser (which
        # reads what Prometheus stored): SIGTERM, taken as Ctrl-C. compare passes it on
        # once, the run checkpoints its last iteration and says how to resume, and both
        # exit 143
        _stop(compare, must_stop=True)
        out = compare.stdout.read()
        assert compare.returncode == 143, out
        assert "interrupted; run the same command again to resume" in out, out
        assert f"monitored-s0: stopped (exit 143), see {run_dir}/train.log" in out, out
        assert psutil.wait_procs([run], timeout=30)[1] == []  # the run ended with it
        assert_stopped_with_checkpoint((run_dir / "train.log").read_text(), run_dir)
        assert not (run_dir / "finished.json").exists()
        _screenshot_graph(prometheus.url, tmp_path / "prometheus-graph.png")
    finally:
        _stop(compare)
        if run is not None and run.is_running():  # its own session: not reached by that
            run.kill()
        prometheus.stop()
        reward.stop()


def _stop(proc: subprocess.Popen, must_stop: bool = False, wait_s: float = 180) -> None:
    """SIGTERM (a background job, as this compare and a background pytest's children
    are, would not even see SIGINT: a non-interactive shell starts background jobs,
    .ci/run's included, with SIGINT ignored)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=wait_s)  # compare waits up to 120 s for its run
        except subprocess.TimeoutExpired:
            proc.kill()
            if must_stop:
                raise AssertionError(f"did not stop on SIGTERM within {wait_s:.0f} s") from None


def _screenshot_graph(url: str, path: Path) -> None:
    """Prometheus' own graph page with two dashboard panels' queries (docs/deploy.md's
    picture: Grafana does not run here)."""
    from urllib.parse import urlencode

    from g2rpo.evaluation.browser import check_page

    panels = ["g2rpo_train_reward_by_granularity", "g2rpo:reward_request_duration_seconds:p99_5m"]
    query = {}
    for i, expr in enumerate(panels):
        query |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.range_input": "5m"}
    time.sleep(3)
    check_page(f"{url}/graph?{urlencode(query)}", [], screenshot=path, wait_until="networkidle")
    assert path.stat().st_size > 10_000
    print(f"prometheus graph screenshot: {path}")
