"""``g2rpo doctor CONFIG``: what a user runs on one GPU node before launching a
cluster. Without Ray, it builds each actor's core exactly as training builds it
(``RolloutWorkerCore``, ``LearnerCore`` as a one-rank group), then runs one of each
thing a training iteration does — publish the learner's weights into the worker,
one rollout share of the config's shape, scoring with the configured scorers
in-process, the precision check (the PPO ratio before any update ÷ the clip
range), one learner update, one evaluation — and reports per phase: pass/fail,
wall time, peak device memory beside the plan's estimate, NFE/s and MFU.

Phases after a failed one that need its result are skipped; the first failure
names its phase and the config field to look at. On the CPU the same phases run
on test-size models (its CI test); memory is then reported for CUDA only."""

from __future__ import annotations

import sys
import time
import traceback
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch

from ..common.algorithms.flops import count_flops, peak_tflops, update_flops, utilisation
from ..common.config.run import G2RPOConfig
from .doctor_fields import field_of
from .doctor_report import DoctorReport, PhaseResult

GiB = 2**30
PRECISION_WARN = 0.5  # of the clip range: below it the ratio moves for no reason rarely


class DeviceMemory:
    """Allocated bytes on a CUDA device and their peak between marks (None elsewhere).
    A sticky CUDA error makes every later call fail: these never raise, they answer
    None and remember that the device is gone (``broken``)."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.broken: str | None = None

    def _ask(self, fn):
        if not self.cuda or self.broken:
            return None
        try:
            torch.cuda.synchronize(self.device)
            return fn(self.device)
        except Exception as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            return None

    def allocated(self) -> int | None:
        return self._ask(torch.cuda.memory_allocated)

    def reset(self) -> None:
        self._ask(torch.cuda.reset_peak_memory_stats)

    def peak(self) -> int | None:
        return self._ask(torch.cuda.max_memory_allocated)


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / GiB, 3)


class Doctor:
    """Runs the phases in order, each on the results of the ones before."""

    def __init__(
        self, cfg: G2RPOConfig, config_name: str, progress: bool = True, host=None
    ) -> None:
        from ..learner.trainer import single_rank
        from .doctor_host import HostOptions

        self.run_cfg, self.host = cfg, host or HostOptions()  # the node check: the run's
        cfg = single_rank(cfg)  # the doctor's learner is one rank, and so is its plan
        self.cfg, self.name, self.progress = cfg, config_name, progress
        self.memory = DeviceMemory(cfg.model.device)
        self.results: list[PhaseResult] = []
        self.held: dict[str, int] = {}  # bytes each built core holds between phases
        self.estimates: dict[str, float] = {}
        self.architecture = cfg.model.pretrained or "none"

    # -------------------------------------------------------------- bookkeeping
    @contextmanager
    def phase(self, name: str, actor: str | None = None, needs: tuple[str, ...] = ()):
        """Run a phase: skipped when a phase it needs did not pass; timed; its
        actor's peak memory is the device's peak less what the other cores hold."""
        result = PhaseResult(phase=name, plan_gib=self.estimates.get(actor or ""))
        self.results.append(result)
        missing = [n for n in needs if not self._passed(n)]
        if self.memory.broken:  # nothing more can run on this device
            result.ok = False
            result.error = f"not run: the device failed earlier ({self.memory.broken})"
            yield None
            return
        if missing:
            result.error = f"skipped: needs {', '.join(missing)}"
            yield None
            return
        if self.progress:
            print(f"g2rpo doctor: {name} ...", file=sys.stderr, flush=True)
        self.memory.reset()
        before = self.memory.allocated()
        t0 = time.perf_counter()
        try:
            yield result
            result.ok = True
        except Exception as exc:  # reported, not raised: the doctor's job is to tell
            result.ok = False
            result.error = f"{type(exc).__name__}: {exc}"
            result.field = field_of(name, exc)
            if self.progress and not getattr(exc, "said", False):  # (a shortfall says it all)
                traceback.print_exc()
        finally:
            peak, after = self.memory.peak(), self.memory.allocated()
            result.seconds = round(time.perf_counter() - t0, 3)
            if None not in (peak, before, after) and actor is not None:
                # what the actor held when the phase began, plus the phase's transient
                # above everything then allocated (other cores, scorers, samples)
                result.peak_gib = _gib(self.held.get(actor, 0) + peak - before)
                self.held[actor] = self.held.get(actor, 0) + after - before  # e.g. AdamW

    def _passed(self, name: str) -> bool:
        return any(r.phase == name and r.ok for r in self.results)

    # -------------------------------------------------------------- phases
    def run(self, scorers: list[str] | None = None) -> DoctorReport:
        with ExitStack() as self._cores:  # the learner's group is left however it ends
            self._phases(scorers)
        return DoctorReport(
            config=self.name,
            device=self.cfg.model.device,
            architecture=self.architecture,
            phases=self.results,
        )

    def _phases(self, scorers: list[str] | None) -> None:
        cfg = self.cfg
        with self.phase("host memory") as r:  # this node against the plan's (doctor_host.py)
            if r is not None:
                from .doctor_host import run_host_phase

                run_host_phase(self.run_cfg, self.host, r)
        if self.host.only:
            return
        with self.phase("plan") as r:
            if r is not None:
                self._plan(r)
        with self.phase("rollout worker", "rollout worker") as r:
            if r is not None:
                from ..rollout_worker.worker import RolloutWorkerCore

                self.worker = RolloutWorkerCore(cfg, 0)
        with self.phase("learner", "learner rank") as r:
            if r is not None:
                self.learner = self._learner()
        with self.phase("publish", needs=("rollout worker", "learner")) as r:
            if r is not None:
                from ..common.wire.weights import state_nbytes

                version, state, checksum = self.learner.weights()
                self.worker.load_weights(version, state, checksum)
                r.details["published_gib"] = _gib(state_nbytes(state))
        with self.phase("rollout", "rollout worker", needs=("rollout worker",)) as r:
            if r is not None:
                self._rollout(r)
        with self.phase("score", needs=("rollout",)) as r:
            if r is not None:
                self._score(r, scorers)
        with self.phase("precision", "learner rank", needs=("publish", "rollout")) as r:
            if r is not None:
                self._precision(r)
        with self.phase("learn", "learner rank", needs=("publish", "score")) as r:
            if r is not None:
                self._learn(r)
        with self.phase("evaluate", "rollout worker", needs=("rollout worker",)) as r:
            if r is not None:
                self._evaluate(r)
        if torch.device(cfg.model.device).type != "cpu":  # host<->device GB/s
            from .doctor_transfer import host_copy_phase

            host_copy_phase(self)
        if cfg.train.placement == "colocated":  # the pair's turns on one GPU
            from .doctor_colocated import colocated_phases

            colocated_phases(self)

    def _plan(self, r: PhaseResult) -> None:
        from .estimate import GiB as PLAN_GIB
        from .estimate import plan

        p = plan(self.cfg)
        self.architecture = p.architecture
        for a in p.actors:
            self.estimates[a.actor] = round(a.peak / PLAN_GIB, 3)
        r.details = {"estimates_gib": dict(self.estimates), "fits": p.fits}

    def _learner(self):
        from ..learner.trainer import learner_outside_ray

        return self._cores.enter_context(learner_outside_ray(self.cfg))

    def _prompts(self, source: str, field: str, n: int) -> list[str]:
        from ..common.prompts.prompts import read_prompts

        prompts = read_prompts(source, field)
        if not prompts:
            raise ValueError(f"{field} {source}: no prompts")
        return [prompts[i % len(prompts)] for i in range(n)]

    def _rollout(self, r: PhaseResult) -> None:
        cfg, worker = self.cfg, self.worker
        share = cfg.train.workers.prompt_shares(cfg.sampling.prompts_per_worker)[0]
        self.prompts = self._prompts(cfg.train.prompts, "train.prompts", share)  # worker 0's
        compile_s = None
        if cfg.model.compile != "none":  # the first rollout compiles: time the second
            t0 = time.perf_counter()
            worker.sample(0, self.prompts)
            compile_s = round(time.perf_counter() - t0, 3)
        parts: dict[str, float] = {}
        self.sampled = worker.sample(0, self.prompts, timings=parts)
        plan, cond, result, _ = self.sampled
        flops = self._flops_per_nfe(cond)
        engine_s = parts["engine_s"]  # NFE/s and MFU of the model calls, not of T5 or the VAE
        r.details = {
            **({"first_rollout_with_compile_s": compile_s} if compile_s is not None else {}),
            "leaves": len(plan.leaves),
            "nfe": result.nfe,
            "model_calls": result.model_calls,
            **{k: round(v, 3) for k, v in parts.items()},
            "nfe_per_s": round(result.nfe / engine_s, 3),
            "flops_per_nfe": flops,
            **utilisation(flops * result.nfe, engine_s, peak_tflops(cfg.model.device)),
        }
        self.flops_per_nfe = flops

    def _flops_per_nfe(self, cond) -> int:
        """FLOPs of one sample's forward (torch's flop counter, one extra call)."""
        result = self.sampled[2]
        x = result.leaf_latents[:1].to(self.worker.comps.device)
        c = {k: v[:1] for k, v in cond.items()}
        t = torch.full((1,), 0.5, device=x.device)
        with torch.inference_mode():
            return count_flops(lambda: self.worker.model(x, t, c))

    def _score(self, r: PhaseResult, scorers: list[str] | None) -> None:
        from ..evaluation.metrics import make_scorers

        specs = scorers or self.cfg.train.reward.scorers or [x.name for x in self.cfg.rewards]
        self.scorers = make_scorers(specs, self.cfg.model.device)
        missing = [x.name for x in self.cfg.rewards if x.name not in self.scorers]
        if missing:
            raise ValueError(f"rewards {missing} have no scorer in train.reward.scorers {specs}")
        plan, _, _, images = self.sampled
        leaf_prompts = [self.prompts[leaf.prompt] for leaf in plan.leaves]
        t0 = time.perf_counter()
        self.scores = {
            name: np.asarray(s.score(images.numpy(), leaf_prompts), dtype=np.float64)
            for name, s in self.scorers.items()
        }
        seconds = time.perf_counter() - t0
        bad = [n for n, v in self.scores.items() if not np.isfinite(v).all()]
        if bad:
            raise ValueError(f"scorers {bad} returned non-finite scores")
        r.details = {
            "images": len(leaf_prompts),
            "images_per_s": round(len(leaf_prompts) / seconds, 3),
            **{f"mean/{n}": round(float(v.mean()), 4) for n, v in self.scores.items()},
        }

    def _precision(self, r: PhaseResult) -> None:
        from ..learner.ratio_check import ratio_before_update

        _, cond, result, _ = self.sampled
        if len(result.transitions) == 0:  # a forward-process method (nft): no ratio
            r.details = {"transitions": 0, "note": "no trajectory log-probs to compare"}
            return
        dev = (ratio_before_update(self.learner, result.transitions, cond) - 1).abs()
        over = float(dev.max()) / self.cfg.optim.clip_range
        r.details = {
            "max_abs_ratio_minus_1": float(dev.max()),
            "max_over_clip": round(over, 4),
            "transitions": int(dev.numel()),
        }
        if over >= PRECISION_WARN:
            r.details["warning"] = (
                f"the ratio moves {over:.2f} of optim.clip_range before any update"
            )
        if over >= 1.0:
            raise ValueError(
                f"|ratio - 1| reaches {over:.2f}x optim.clip_range before any update: the "
                "rollout and the learner compute different log-probs (model.dtype, "
                "model.rollout_weights_dtype, model.mixed_precision)"
            )

    def _learn(self, r: PhaseResult) -> None:
        plan, cond, result, _ = self.sampled
        batch = self.worker.trajectories(0, self.prompts, plan, cond, result, self.scores)
        t0 = time.perf_counter()
        stats = self.learner.update([batch])
        if self.memory.cuda:
            torch.cuda.synchronize(self.memory.device)
        seconds = time.perf_counter() - t0
        if not np.isfinite(stats["loss"]) or not np.isfinite(stats["grad_norm"]):
            raise ValueError(f"non-finite update: loss {stats['loss']}, grad {stats['grad_norm']}")
        flops = update_flops(
            getattr(self, "flops_per_nfe", 0),
            stats["nfe_learn"],
            stats["nfe_learn_no_grad"],
            self.cfg.model.gradient_checkpointing,
            frozen_base=self.cfg.model.lora is not None,
        )
        r.details = {
            "optimizer_steps": stats["optimizer_steps"],
            "transitions": stats["transitions"],
            "learner_forwards": stats["nfe_learn"],
            "learner_forwards_without_backward": stats["nfe_learn_no_grad"],
            "loss": stats["loss"],
            "grad_norm": stats["grad_norm"],
            "clip_fraction": stats["clip_fraction"],
            **utilisation(flops, seconds, peak_tflops(self.cfg.model.device)),
        }

    def _evaluate(self, r: PhaseResult) -> None:
        t = self.cfg.train
        prompts = self._prompts(t.eval.prompts, "train.eval.prompts", min(t.eval.samples, 4))
        t0 = time.perf_counter()
        images = self.worker.eval_images(prompts, t.eval.seed)
        seconds = time.perf_counter() - t0
        r.details = {"images": len(prompts), "images_per_s": round(len(prompts) / seconds, 3)}
        for name, scorer in getattr(self, "scorers", {}).items():
            r.details[f"mean/{name}"] = round(float(np.mean(scorer.score(images, prompts))), 4)


def run_doctor(
    cfg: G2RPOConfig,
    config_name: str,
    scorers: list[str] | None = None,
    progress: bool = True,
    host=None,
) -> DoctorReport:
    """``host``: the node check's options (``doctor_host.HostOptions``)."""
    return Doctor(cfg, config_name, progress, host).run(scorers)


def random_weights_config(
    cfg: G2RPOConfig, out: Path, name: str, blocks: tuple[int, int] | None
) -> G2RPOConfig:
    """``cfg`` pointed at a random-weight pipeline of architecture ``name`` built in
    ``out`` (transformer and text encoders in model.dtype)."""
    from .random_pipeline import build_random_pipeline

    dtype = getattr(torch, cfg.model.dtype)
    path = build_random_pipeline(
        out / "pipeline", name, blocks=blocks, dtype=dtype, device=cfg.model.device
    )
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"pretrained": str(path)})})
