"""One queue and one worker thread per model: requests wait in a bounded queue, the worker takes as many as fit
one call (``max_rows``) or as arrive within the batch timeout, runs them together and hands each its result."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable

__all__ = ["Batcher", "Job", "QueueFull"]


class QueueFull(RuntimeError):
    """The model's queue holds ``max_queue`` requests already."""


@dataclasses.dataclass(eq=False)
class Job:
    """One request's work: ``rows`` of the batch it joins, what the model runs (``payload``), the future its
    handler awaits, its deadline (time.monotonic) and a cancel flag the worker thread reads between steps."""

    model: str
    rows: int
    payload: Any
    deadline: float
    future: asyncio.Future | None = None
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)

    def dead(self) -> bool:
        return self.cancel.is_set() or time.monotonic() > self.deadline


class Batcher:
    """Gathers the jobs of one model into calls of ``run(jobs) -> results`` (one result per job, in order) made on
    the model's own thread. ``max_rows`` 1 runs each job alone."""

    def __init__(self, name: str, run: Callable[[list], list], *, max_rows: int, timeout_s: float, max_queue: int,
                 metrics=None):
        self.name, self._run, self.max_rows, self.timeout_s, self.max_queue = name, run, max_rows, timeout_s, max_queue
        self._metrics = metrics
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"serve-{name}")
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self.waiting = 0
        self.running = 0

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=True)

    def call_in_thread(self, fn: Callable, *args) -> asyncio.Future:
        """Run ``fn`` on the model's thread (between batches): warm-up compiles."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def submit(self, job: Job) -> asyncio.Future:
        """Queue ``job``; its future gets the result or the exception. Raises QueueFull when the queue is full."""
        if self.waiting >= self.max_queue:
            if self._metrics is not None:
                self._metrics.rejected.labels(self.name, "queue_full").inc()
            raise QueueFull(self.name)
        job.future = asyncio.get_running_loop().create_future()
        self.waiting += 1
        self._gauge()
        self._queue.put_nowait(job)
        return job.future

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.name).set(self.waiting)
            self._metrics.running.labels(self.name).set(self.running)

    def _take(self, job: Job) -> bool:
        """Count ``job`` off the queue; False (its future settled) when it was cancelled or its deadline passed."""
        self.waiting -= 1
        self._gauge()
        if job.future.done():  # its handler gave up on it (and counted it)
            return False
        if job.dead():  # its handler is about to give up: nobody waits for a result
            job.future.cancel()
            return False
        return True

    async def _loop(self) -> None:
        q, carry = self._queue, None
        loop = asyncio.get_running_loop()
        while True:
            if carry is not None:
                job, carry = carry, None
            else:
                job = await q.get()
                if not self._take(job):
                    continue
            batch, rows = [job], job.rows
            end = time.monotonic() + self.timeout_s
            while rows < self.max_rows:
                try:
                    nxt = q.get_nowait()
                except asyncio.QueueEmpty:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(q.get(), left)
                    except TimeoutError:
                        break
                if not self._take(nxt):
                    continue
                if rows + nxt.rows > self.max_rows:
                    carry = nxt  # taken off the queue already: it leads the next batch
                    break
                batch.append(nxt)
                rows += nxt.rows
            self.running = len(batch)
            self._gauge()
            if self._metrics is not None:
                self._metrics.batch_rows.labels(self.name).observe(rows)
                self._metrics.batch_requests.labels(self.name).observe(len(batch))
            try:
                results = await loop.run_in_executor(self._pool, self._run, batch)
            except Exception as e:  # noqa: BLE001 - the model's error goes to every request of the batch
                for j in batch:
                    if not j.future.done():
                        j.future.set_exception(e)
            else:
                for j, r in zip(batch, results):
                    if not j.future.done():
                        j.future.set_result(r)  # an exception instance is that job's own error
            finally:
                self.running = 0
                self._gauge()
