"""One rollout worker's job, without Ray: load the pipeline, take a weight version,
roll out its prompts, decode, score through the reward service, return trajectories."""

from __future__ import annotations

import time

import numpy as np
import torch

from ..common.algorithms.rollout_plan import RolloutPlan, algorithm_nfe
from ..common.algorithms.seeds import seed_for
from ..common.cluster.time_sharing import (
    HOST,
    WORKER_PARTS,
    DeviceTurn,
    HostMirror,
    move_module,
    synchronize,
)
from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from ..common.families.lora import attach_lora
from ..common.families.registry import PipelineComponents, config_sampling_grid, family_class
from ..common.families.transformer_compile import check_placement
from ..common.health import image_health
from ..common.paths import resolve_path
from ..common.wire.messages import EvalSamples, RewardEndpoints, WeightsLoaded
from ..common.wire.trajectories import Trajectories
from ..common.wire.weights import load_published
from ..reward_server.client import RewardClient
from .engine import RolloutEngine, draw_noise
from .plan import anchor_plan, plan_for


@torch.no_grad()
def sample_on_pipeline(
    comps: PipelineComponents,
    model,
    grid,
    plan: RolloutPlan,
    prompts: list[str],
    gen: torch.Generator,
    *,
    size: int,
    max_sequence_length: int,
    max_batch: int = 256,
    decode_batch: int = 64,
    timings: dict[str, float] | None = None,
    rows: slice | None = None,
):
    """Encode the prompts, run the plan with noise drawn from ``gen``, decode every
    leaf: (prompt embeddings, RolloutResult, uint8 images [leaves, size, size, 3]).
    ``timings``, when given, gets each part's seconds (encode_s, engine_s, decode_s),
    the device synchronised at each boundary. ``rows``: an anchor plan whose initial
    noise is these rows of the noise ``gen`` draws for ``rows.stop`` roots (one slice of
    an evaluation shared by several workers sees the noise it would alone)."""
    clock = _PartClock(comps.device, timings)
    cond = comps.encode_prompts(prompts, max_sequence_length)
    clock.lap("encode_s")
    # drawn on the CPU generator (the same noise on any device), moved once
    noise = draw_noise(plan, comps.packed_shape(size, size), gen, rows)
    init, sde = (t.to(comps.device) for t in noise)
    result = RolloutEngine(model, grid, max_batch=max_batch).run(plan, cond, init, sde)
    clock.lap("engine_s")
    images = comps.decode(result.leaf_latents, size, size, batch=decode_batch)
    clock.lap("decode_s")
    return cond, result, images


class _PartClock:
    """Seconds per part of a rollout, only when asked (a CUDA sync per part)."""

    def __init__(self, device: torch.device, out: dict[str, float] | None) -> None:
        self.device, self.out = device, out
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.out is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.out[name] = now - self.t
        self.t = now


class RolloutWorkerCore:
    def __init__(self, cfg: G2RPOConfig, worker: int) -> None:
        torch.set_num_threads(cfg.train.threads)
        self.cfg, self.worker = cfg, worker
        if cfg.model.pretrained is None:
            raise ConfigError("model.pretrained: a local pipeline directory is needed for training")
        check_placement(cfg.model.compile, cfg.train.placement)  # before a pipeline loads
        self.comps = family_class(cfg).load(
            resolve_path(cfg.model.pretrained),
            dtype=cfg.model.rollout_weights_torch_dtype(),
            device=cfg.model.device,
            text_encoder_dtype=cfg.model.autocast_dtype() or torch.float32,
        )
        attach_lora(self.comps.transformer, cfg)  # replaced by the published ones on load
        self.comps.for_inference()  # the adapters too: no grad, no autocast weight cache
        size = cfg.train.image_size
        self.model = self.comps.velocity_model(
            size,
            size,
            guidance=cfg.model.guidance,
            autocast_dtype=cfg.model.autocast_dtype(),
            attention_backend=cfg.model.attention_backend,
        ).for_rollout(cfg.model.compile, cfg.model.rollout_attention_backend)
        self.grid = config_sampling_grid(cfg)
        self.version, self.checksum = 0, None
        self.client: RewardClient | None = None
        self.client_urls: tuple = ()
        # offload(): the transformer on the host while the learner computes (as
        # train.offload.worker says), in host buffers allocated once and reused
        self.mirror = HostMirror(cfg.model.device)
        self.turn = DeviceTurn(
            cfg.model.device, self._move_to, WORKER_PARTS[cfg.train.offload.worker]
        )
        self._receiver = None  # a version being handed over inside the device (ipc_handoff)
        self.onload_at_handoff_s = 0.0  # the transformer came back to take a version

    def _move_to(self, device: torch.device, parts: tuple[str, ...]) -> None:
        target = None if device == HOST else device
        move_module(self.comps.transformer, self.mirror, target)
        synchronize(self.turn.device)  # the copies were issued non_blocking

    def offload(self) -> float:
        """Colocated time-sharing (``train.placement``): the transformer's weights to the
        host (``train.offload.worker`` all; none keeps them resident) and the device's
        cached blocks freed, so the learner rank beside this worker has the GPU. The text
        encoders and the VAE stay (a FLUX worker's residue: ~10 GB of T5-XXL and CLIP in
        bf16). The next sampling or handoff brings the weights back; a version from the
        object store may be loaded into them meanwhile."""
        return self.turn.offload()

    def resident(self) -> float:
        """The transformer back on ``model.device`` after ``offload`` (else a no-op);
        its seconds."""
        return self.turn.resident()

    def load_weights(self, version: int, state: dict, checksum: str) -> WeightsLoaded:
        t0 = time.perf_counter()
        load_published(
            self.comps.transformer, version, state, checksum, self.cfg.model.lora is not None
        )
        self.version, self.checksum = version, checksum
        return WeightsLoaded(version, checksum, time.perf_counter() - t0)

    def take_bucket(self, message, bucket=None) -> int:
        """One bucket of a version handed over inside the device (``common/wire/ipc_handoff``):
        copied into the transformer on the device, which comes back first if it waited
        on the host, so none of the version's bytes pass through host memory.
        ``bucket``: the sender's own, when it is this process (the doctor)."""
        from ..common.wire.ipc_handoff import BucketReceiver, device_identity

        if self._receiver is None or self._receiver.version != message.version:
            self._handoff_t0 = time.perf_counter()
            self.onload_at_handoff_s += self.resident()  # (counted in the rollout's row)
            targets = self.comps.transformer.state_dict()  # views of the weights
            identity = device_identity(self.cfg.model.device)
            self._receiver = BucketReceiver(message.version, targets, self.turn.device, identity)
        return self._receiver.take(message, bucket)

    def finish_handoff(self, version: int, checksum: str) -> WeightsLoaded:
        """The handoff of ``version`` complete: what this worker holds, checked against
        the sender's device checksum."""
        from ..common.wire.weights import WeightMismatch

        receiver, self._receiver = self._receiver, None
        if receiver is None or receiver.version != version:
            raise WeightMismatch(f"weights v{version}: no bucket of it was handed over")
        got = receiver.finish()
        if got != checksum:
            raise WeightMismatch(f"weights v{version}: checksum {got} != handed over {checksum}")
        self.version, self.checksum = version, checksum
        return WeightsLoaded(version, checksum, time.perf_counter() - self._handoff_t0)

    def _reward_client(self, rewards: RewardEndpoints) -> RewardClient:
        key = (tuple(rewards.urls), rewards.redis_url)
        if self.client is None or key != self.client_urls:
            if self.client is not None:
                self.client.close()
            self.client = RewardClient(
                rewards.urls or None,
                redis_url=rewards.redis_url,
                redis_password=rewards.redis_password,
                token=rewards.token,
                ca_file=self.cfg.train.reward.tls_ca_file,
                deadline_s=self.cfg.train.reward.deadline_s,
                # a FLUX worker's leaves are hundreds of MiB: sent as bounded requests
                request_bytes=int(self.cfg.train.reward.request_mib * 2**20),
                concurrency=self.cfg.train.reward.concurrency,
            )
            self.client_urls = key
        return self.client

    def _scorer_names(self, rewards: RewardEndpoints) -> list[str]:
        return rewards.scorers or [r.name for r in self.cfg.rewards]

    def _sample(
        self, plan: RolloutPlan, prompts: list[str], gen: torch.Generator, timings=None, rows=None
    ):
        self.resident()  # the pipeline's device is its transformer's
        return sample_on_pipeline(
            self.comps,
            self.model,
            self.grid,
            plan,
            prompts,
            gen,
            size=self.cfg.train.image_size,
            max_sequence_length=self.cfg.train.max_sequence_length,
            max_batch=self.cfg.sampling.max_batch,
            decode_batch=self.cfg.sampling.decode_batch,
            timings=timings,
            rows=rows,
        )

    def sample(self, iteration: int, prompts: list[str], timings: dict | None = None):
        """This worker's rollout tree of an iteration, unscored: (plan, prompt
        embeddings, RolloutResult, uint8 leaf images); the noise and the plan are
        drawn from (run seed, iteration, worker). ``timings``: see sample_on_pipeline."""
        gen = torch.Generator().manual_seed(seed_for(self.cfg.run.seed, iteration, self.worker))
        plan = plan_for(self.cfg, iteration, gen, self.worker)  # its own prompt count
        if plan.num_prompts != len(prompts):
            raise ValueError(
                f"worker {self.worker}: got {len(prompts)} prompts, plan needs {plan.num_prompts}"
            )
        cond, result, images = self._sample(plan, prompts, gen, timings)
        return plan, cond, result, images

    def rollout(self, iteration: int, prompts: list[str], rewards: RewardEndpoints) -> Trajectories:
        # (its own seconds, not the rollout's; or the handoff's, which brought it back)
        onload_s = self.resident() + self.onload_at_handoff_s
        self.onload_at_handoff_s = 0.0
        t0 = time.perf_counter()
        plan, cond, result, images = self.sample(iteration, prompts)
        t1 = time.perf_counter()
        leaf_prompts = [prompts[leaf.prompt] for leaf in plan.leaves]
        client = self._reward_client(rewards)
        response = client.score(
            images.numpy(),
            leaf_prompts,
            self._scorer_names(rewards),
            request_id=f"it{iteration}-w{self.worker}",
        )
        t2 = time.perf_counter()
        sent = client.last_requests
        timings = {
            "rollout_s": t1 - t0,
            "reward_s": t2 - t1,
            "reward_requests": len(sent),
            "reward_request_bytes": max((r.body_bytes for r in sent), default=0),
        }
        batch = self.trajectories(
            iteration,
            prompts,
            plan,
            cond,
            result,
            response.scores,
            timings=timings,
        )
        if self.cfg.train.placement == "colocated":  # the update has the GPU next
            # after the batch left the device: the offload's empty_cache then frees its
            # tensors' blocks too, and the moves never wait behind the batch's copies
            del cond, result
            batch.timings.update(onload_s=onload_s, offload_s=self.offload())
        return batch

    def trajectories(
        self, iteration, prompts, plan, cond, result, scores, timings=None
    ) -> Trajectories:
        """What leaves the worker for the learner, on the CPU: a GPU-less driver must
        be able to hold it, and the learner moves it to its own device."""
        return Trajectories(
            worker=self.worker,
            iteration=iteration,
            version=self.version,
            prompts=list(prompts),
            plan=plan,
            transitions=result.transitions.to("cpu"),
            cond={k: v.detach().cpu() for k, v in cond.items()},
            leaf_rewards={n: torch.as_tensor(v, dtype=torch.float32) for n, v in scores.items()},
            nfe=result.nfe,
            model_calls=result.model_calls,
            nfe_algorithm=algorithm_nfe(plan),
            timings=dict(timings or {}),
            leaf_latents=result.leaf_latents.detach().cpu() if plan.keep_leaves else None,
        )

    def evaluate(
        self, prompts: list[str], seed: int, rewards: RewardEndpoints, first: int = 0, total=None
    ) -> EvalSamples:
        """Deterministic anchor samples of fixed prompts with fixed noise, scored, with
        the image embeddings of one scorer that has them (a held-out one first);
        ``first``/``total``: see ``eval_images``."""
        from ..reward_server.embeddings import embedding_scorer, response_embeddings

        t0 = time.perf_counter()
        images = self.eval_images(prompts, seed, first, total)
        names = self._scorer_names(rewards)
        embedder = embedding_scorer(names, [r.name for r in self.cfg.rewards])
        embed = [embedder] if embedder else []
        response = self._reward_client(rewards).score(images, prompts, names, embed=embed)
        health = {k: v.tolist() for k, v in image_health.per_image(images).items()}
        return EvalSamples(
            images,
            response.scores,
            time.perf_counter() - t0,
            self.version,
            health=health,
            thumbnails=image_health.thumbnails(images),
            embeddings=response_embeddings(response, embedder) if embedder else None,
            embedding_scorer=embedder,
        )

    def eval_images(
        self, prompts: list[str], seed: int, first: int = 0, total: int | None = None
    ) -> np.ndarray:
        """The policy's deterministic sample of each prompt from noise drawn from
        ``seed``: uint8 [P, H, W, 3]. ``prompts`` may be samples ``first`` .. of an
        evaluation of ``total``, spread over workers: each sample gets the noise it
        gets in the whole evaluation."""
        gen = torch.Generator().manual_seed(seed)
        plan = anchor_plan(len(prompts), self.cfg.sampling.num_steps)
        rows = None if total is None else slice(first, first + len(prompts))
        if rows is not None and rows.stop > total:
            raise ValueError(f"samples {first}..{rows.stop} of an evaluation of {total}")
        _, _, images = self._sample(plan, prompts, gen, rows=rows)
        return images.numpy()
