"""`g2rpo doctor` on a colocated config runs the pair's turns (issue 55, item 11): the
worker steps aside, the version is handed over as it crosses Ray while the learner's
state goes to the host, the worker samples on it, then the learner comes back and
updates. On the stand-in accelerator (tests/fake_accelerator.py) every move really
happens, so a tensor left behind or a kernel given state on two devices fails here as
it would on CUDA; bin/gpu-check runs the same phases at FLUX width on a GPU."""

from pathlib import Path

import pytest
from fake_accelerator import NAME, on_fake_gpu

REPO = Path(__file__).resolve().parents[1]
COLOCATED = ["train.placement=colocated", "train.workers.count=1"]


def _config(device: str):
    from g2rpo.common.config.loading import load_config

    return load_config(
        REPO / "configs" / "tiny.yaml",
        [
            f"model.device={device}",
            "sampling.sde_steps=[0]",
            "sampling.group_size=3",
            "train.eval.samples=2",
            *COLOCATED,
        ],
    )


def _doctor(device: str):
    from g2rpo.planning.doctor import run_doctor

    return run_doctor(_config(device), "tiny", progress=False)


def test_the_colocated_turns_pass_with_every_move_made():
    with on_fake_gpu():
        rep = _doctor(NAME)
    failed = [(p.phase, p.error) for p in rep.phases if not p.ok]
    assert failed == [], failed
    phases = {p.phase: p for p in rep.phases}
    assert list(phases)[-4:] == ["offload worker", "handoff", "rollout again", "onload, learn"]
    assert phases["offload worker"].details["offload_s"] > 0  # it moved
    handoff = phases["handoff"].details
    assert handoff["learner_offload_s"] > 0 and handoff["published_gib"] > 0
    assert handoff["host_gib_while_loading"]["RssAnon"] > 0
    assert phases["rollout again"].details["worker_onload_s"] > 0
    assert phases["onload, learn"].details["onload_s"] > 0
    # issue 56: the version went into the worker's transformer on the device, bucket by
    # bucket, checked by its device checksum (finish_handoff raises on a mismatch)
    assert handoff["buckets"] >= 1 and handoff["gib_per_s"] > 0
    assert handoff["offload"] == {"learner": "optimizer,weights", "worker": "transformer"}
    # and the node's host<->device copy rate, both ways, as calibration rows
    from g2rpo.planning.doctor_calibration import rates_from_report

    copy = phases["host copy"].details
    assert copy["offload_copies"] == "pageable"  # (pinned memory needs CUDA)
    assert all(v > 0 for v in copy["gbps"]["pageable"].values())
    rows = [
        r for r in rates_from_report(_config(NAME), rep, NAME) if r.quantity == "host_copy_gbps"
    ]
    want = sorted(copy["gbps"]["pageable"].values())
    assert sorted(r.value for r in rows) == pytest.approx(want, rel=1e-4)
    assert {r.source for r in rows} == {"measured"} and len(rows) == 2


def test_a_learner_that_keeps_a_tensor_on_the_device_fails_the_handoff(monkeypatch):
    from g2rpo.learner.trainer import LearnerCore

    move = LearnerCore._move_to

    def forgets_the_moments(self, device, *parts):  # the bug class: state left on the device
        optimizer = self.optimizer
        state = {p: dict(s) for p, s in optimizer.state.items()}
        move(self, device, *parts)
        if device.type == "cpu":
            optimizer.state.update(state)

    monkeypatch.setattr(LearnerCore, "_move_to", forgets_the_moments)
    with on_fake_gpu():
        rep = _doctor(NAME)
    handoff = next(p for p in rep.phases if p.phase == "handoff")
    assert handoff.ok is False
    assert "the learner rank left" in handoff.error and "after offloading" in handoff.error
