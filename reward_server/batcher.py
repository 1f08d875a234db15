"""Dynamic batching per scorer: concurrent requests are merged into one scorer call
of up to ``max_batch`` images, waiting at most ``max_wait_s`` for company."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .scorers.base import Scorer


@dataclass
class _Job:
    images: np.ndarray
    prompts: list[str]
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


class DynamicBatcher:
    def __init__(
        self,
        scorer: Scorer,
        max_batch: int,
        max_wait_s: float,
        on_batch: Callable[[str, int, float], None] | None = None,
        on_depth: Callable[[str, int], None] | None = None,
    ) -> None:
        self.scorer = scorer
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.on_batch = on_batch or (lambda name, n, seconds: None)
        self.on_depth = on_depth or (lambda name, depth: None)
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._carry: _Job | None = None
        self._waiting = 0
        # one thread per scorer: a model is not assumed to be thread-safe
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"score-{scorer.name}")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def score(self, images: np.ndarray, prompts: list[str]) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self._waiting += len(prompts)
        self.on_depth(self.scorer.name, self._waiting)
        await self._queue.put(_Job(images, prompts, future))
        return await future

    async def call(self, fn, *args):
        """``fn(*args)`` on this scorer's thread, between its batches (reward_server/
        embeddings.py: an image embedding from the same model)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _next(self, timeout: float | None) -> _Job | None:
        if self._carry is not None:
            job, self._carry = self._carry, None
            return job
        if timeout is None:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next(None)
            batch, count = [first], len(first.prompts)
            deadline = loop.time() + self.max_wait_s
            while count < self.max_batch:
                job = await self._next(max(deadline - loop.time(), 0.0))
                if job is None:
                    break
                # images of another size, or too many, wait for the next batch
                if job.images.shape[1:] != first.images.shape[1:] or (
                    count + len(job.prompts) > self.max_batch
                ):
                    self._carry = job
                    break
                batch.append(job)
                count += len(job.prompts)
            await self._execute(batch, count)

    async def _execute(self, batch: list[_Job], count: int) -> None:
        # runs on the event loop: a lone request's images are used as they are, uncopied
        images = batch[0].images if len(batch) == 1 else np.concatenate([j.images for j in batch])
        prompts = [p for j in batch for p in j.prompts]
        self._waiting -= count
        self.on_depth(self.scorer.name, self._waiting)
        loop = asyncio.get_running_loop()
        parts = []
        try:
            # a request larger than max_batch is scored in max_batch-sized calls
            for lo in range(0, count, self.max_batch):
                hi = min(lo + self.max_batch, count)
                start = time.perf_counter()
                parts.append(
                    await loop.run_in_executor(
                        self._pool, self.scorer.score, images[lo:hi], prompts[lo:hi]
                    )
                )
                self.on_batch(self.scorer.name, hi - lo, time.perf_counter() - start)
        except Exception as exc:  # handed to every waiting request
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        scores = np.concatenate(parts)
        offset = 0
        for job in batch:
            n = len(job.prompts)
            if not job.future.done():
                job.future.set_result(np.asarray(scores[offset : offset + n], dtype=np.float32))
            offset += n
