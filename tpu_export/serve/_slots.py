"""Continuous batching of an LM converted with ``slots=B`` (cache protocol 2, converter/llm.py): ``SlotEngine``
runs up to B generations in the rows of one ``decode_slots`` call, each at its own length, and ``SlotScheduler``
puts the server's requests into its rows as they arrive and takes them out as they end, between decode steps.

A request is prefilled alone (the batch-1 ``prefill_<L>`` signatures, in the chunks of ``prefill_plan``), its caches
are copied into a free row (``insert_slot``); or, where several requests whose prompts fit one prefill length arrive
together, k of them are prefilled in one call straight into their rows (``slots_prefill_<L>``: on a CPU a prefill
call's cost is mostly reading the weights once, so 8 requests in one call cost about what 3 alone do). Then every
decode step feeds each busy row its last token at its own
position and samples each row's next token on the host with the request's own sampler (``Sampling.picker``, the
one ``generate`` uses): the same prefill, the same sampler and RNG stream as a solo ``generate``. A free row runs
too (token 0 at position 0) and is ignored: each row is computed from its own inputs only.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Callable

__all__ = ["SlotEngine", "SlotScheduler", "SlotSeq"]


@dataclasses.dataclass(eq=False)
class SlotSeq:
    """One generation in a slot engine: the prompt ``ids``, at most ``max_tokens`` new tokens, the next-token
    ``pick`` (``Sampling.picker()``), the stop token ids, and ``on_token(token) -> bool`` (True: stop after this
    token, e.g. a stop string was generated). ``finish`` is "stop" or "length" once it ends."""

    ids: list
    max_tokens: int
    pick: Callable
    stops: frozenset = frozenset()
    on_token: Callable[[int], bool] | None = None
    tokens: list = dataclasses.field(default_factory=list)
    finish: str | None = None
    slot: int | None = None
    first_token_s: float | None = None  # perf_counter time of the first new token
    plan: list = dataclasses.field(default_factory=list)
    caches: dict | None = None  # batch-1 caches while prefilling
    feed: int = 0  # the token the next decode step feeds this row, at position ``pos``
    pos: int = 0
    in_row: bool = False  # prefilled straight into its row (slots_prefill_<L>): it decodes in decode_slots


class SlotEngine:
    """B rows of ``decode_slots`` over a loaded LM artifact (``runtime``: tpu_backend.llm.OnDeviceLM, ``spec``: its
    batch-1 CacheSpec); ``rows``: use at most that many of them. ``add`` a SlotSeq into a free row, ``step`` until
    it ends; one thread at a time.

    Raises:
        ValueError: the artifact has no decode_slots / insert_slot, or their caches are not ``spec``'s over B rows.
    """

    def __init__(self, runtime, spec, slots: int, name: str = "the model", rows: int | None = None):
        from tpu_export.generate import prefill_lengths

        self.runtime, self.spec, self.slots = runtime, spec, int(slots)
        self.program = runtime.program
        self.rows = dataclasses.replace(spec, batch=self.slots)
        names = set(self.program.signature_names)
        if not {"decode_slots", "insert_slot"} <= names:
            raise ValueError(f"{name}: no decode_slots / insert_slot signature; convert it with slots (--target "
                             "NAME:slots=B)")
        have = {i.name: tuple(i.shape) for i in self.program.signature("decode_slots").inputs}
        want = {"tokens": (self.slots, 1), "input_pos": (self.slots,), **self.rows.shapes()}
        if have != want:
            raise ValueError(f"{name}: its decode_slots inputs {have} are not lm.json's {self.slots} slots of its "
                             f"cache {want}; convert the model again")
        self.lengths = prefill_lengths(runtime)
        # the row counts a step can run: decode_slots_<k> over the first k rows, decode_slots over all B
        self.sizes = sorted({int(n[len("decode_slots_"):]) for n in names if n.startswith("decode_slots_")
                             and n[len("decode_slots_"):].isdigit() and int(n[len("decode_slots_"):]) < self.slots}
                            | {self.slots})
        # slots_prefill_<L>: L -> the requests one call prefills into their rows
        self.many = {int(n[len("slots_prefill_"):]): int(self.program.signature(n).inputs[0].shape[0])
                     for n in names if n.startswith("slots_prefill_") and n[len("slots_prefill_"):].isdigit()}
        self.caches = None  # the B-row caches; device arrays after the first call, donated to each next one
        # the rows handed out (``rows``: at most that many of the B; the others stay free and ignored)
        self.free = list(range(min(self.slots, rows or self.slots) - 1, -1, -1))
        self.prefilling: collections.deque = collections.deque()
        self.decoding: dict = {}  # row -> SlotSeq
        self.solo: SlotSeq | None = None  # a request decoding alone, on the batch-1 decode (its row reserved)
        self.steps = 0  # decode calls
        self.calls: collections.Counter = collections.Counter()  # decode calls by signature

    def add(self, seq: SlotSeq) -> bool:
        """Give ``seq`` a free row (False: none free). Its prefill runs in the next ``step`` calls."""
        from tpu_export.targets.lm_runtime import prefill_plan

        if not self.free:
            return False
        n = len(seq.ids)
        if n + seq.max_tokens - 1 > self.spec.cache_len:
            raise ValueError(f"{n} prompt tokens + {seq.max_tokens} new tokens need {n + seq.max_tokens - 1} cache "
                             f"slots; the cache holds {self.spec.cache_len}")
        seq.plan = prefill_plan(n - 1, self.lengths, self.spec.cache_len)
        seq.slot = min(self.free)  # the lowest free row: busy rows stay packed, so a step runs few rows
        self.free.remove(seq.slot)
        seq.feed, seq.pos = int(seq.ids[-1]), n - 1
        seq.caches = self.spec.zeros() if seq.plan else None
        self.prefilling.append(seq)
        return True

    def drop(self, seq: SlotSeq) -> None:
        """Take ``seq`` out now (cancelled): its row is free for the next request."""
        if seq.slot is None:
            return
        if self.solo is seq:
            self.solo = None
        elif self.decoding.get(seq.slot) is seq:
            del self.decoding[seq.slot]
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
        else:
            return
        self.free.append(seq.slot)
        seq.caches = None

    def step(self) -> list:
        """The next prefill chunk of every request being prefilled (all of their chunks when none decodes yet),
        then one decode step; returns the SlotSeqs that ended in it (their rows are free again). A prompt that fits
        one prefill length joins the decode in the step it arrives; a long one is prefilled a chunk per step, so
        that the rows decoding meanwhile wait for one chunk at a time. A request decoding alone runs the batch-1
        ``decode`` (what ``generate`` runs, and on a CPU far cheaper than B rows); the step another one is ready,
        its caches go into its row and both decode in ``decode_slots``."""
        ready = self._prefill_many()
        while self.prefilling:
            for seq in list(self.prefilling):
                if seq.plan:
                    self._prefill_chunk(seq)
                if not seq.plan:
                    self.prefilling.remove(seq)
                    ready.append(seq)
            if self.decoding or self.solo is not None or ready:
                break
        if self.solo is None and not self.decoding and len(ready) == 1 and not ready[0].in_row:
            self.solo = ready.pop()
            if self.solo.caches is None:  # a 1-token prompt: nothing prefilled
                self.solo.caches = self.spec.zeros()
        elif self.solo is not None and ready:
            ready.append(self.solo)
            self.solo = None
        for seq in ready:
            self._insert(seq)
            self.decoding[seq.slot] = seq
        if self.solo is not None:
            return self._decode_solo()
        return self._decode() if self.decoding else []

    def _prefill_many(self) -> list:
        """The requests waiting whose whole prompt fits one prefill length L, k at a time in ``slots_prefill_<L>``
        calls straight into their rows, where at least half of a call's k rows are real requests (fewer are
        cheaper prefilled alone; the spare rows repeat the first request); returns them, ready to decode."""
        import torch

        groups: dict = {}
        for seq in self.prefilling:
            # the whole prompt in one chunk from position 0: a later chunk of a longer one reads its own
            # batch-1 caches, not its row
            if len(seq.plan) == 1 and seq.plan[0][0] == 0 and seq.plan[0][2] in self.many:
                groups.setdefault(seq.plan[0][2], []).append(seq)
        ready = []
        for L, seqs in groups.items():
            k = self.many[L]
            while len(seqs) >= max(2, (k + 1) // 2):
                batch, seqs = seqs[:k], seqs[k:]
                fill = batch + [batch[0]] * (k - len(batch))
                tokens = torch.tensor([s.ids[:s.plan[0][1]] + [0] * (L - s.plan[0][1]) for s in fill],
                                      dtype=torch.int32)
                # one position row for the k prompts: 0..L-1. A real token's keys and values depend on its own
                # position and the slots before it only, so they are the batch-1 prefill's; the pad slots past a
                # prompt hold other values than there, and are overwritten (decode) before they are read.
                pos = torch.arange(L, dtype=torch.int32)
                self._ensure_caches()
                out = self.program.run_on_device(tokens, pos, torch.tensor([s.slot for s in fill], dtype=torch.int32),
                                                 signature_name=f"slots_prefill_{L}", **self.caches)
                self.calls[f"slots_prefill_{L}"] += 1
                self.caches = {n: out[n] for n in self.rows.names()}
                for s in batch:
                    s.plan, s.caches, s.in_row = [], None, True
                    self.prefilling.remove(s)
                    ready.append(s)
        return ready

    def _prefill_chunk(self, seq: SlotSeq) -> None:
        import torch

        start, count, L = seq.plan.pop(0)
        pad = L - count
        tokens = torch.tensor([seq.ids[start:start + count] + [0] * pad], dtype=torch.int32)
        pos = torch.tensor(list(range(start, start + count)) + [0] * pad, dtype=torch.int32)  # as prompt_step pads
        out = self.runtime(tokens, pos, signature_name=f"prefill_{L}", **seq.caches)
        seq.caches = {k: out[k] for k in self.spec.names()}

    def _ensure_caches(self) -> None:
        if self.caches is None:
            self.caches = self.rows.zeros()

    def _insert(self, seq: SlotSeq) -> None:
        """The request's prefilled caches into its row; a 1-token prompt has none (its row's old slots are never
        read: decode writes position 0 before it attends to it)."""
        import torch

        self._ensure_caches()
        if seq.caches is None:
            return
        new = {f"new_{n}": v for n, v in seq.caches.items()}
        self.caches = dict(self.program.run_on_device(torch.tensor([seq.slot], dtype=torch.int32),
                                                      signature_name="insert_slot", **self.caches, **new))
        seq.caches = None

    def _decode(self) -> list:
        import numpy as np
        import torch

        from tpu_export.tpu_backend.artifact.dtypes import numpy_to_torch

        self._ensure_caches()
        k = next(s for s in self.sizes if s > max(self.decoding))
        tokens = torch.zeros(k, 1, dtype=torch.int32)
        pos = torch.zeros(k, dtype=torch.int32)
        for row, seq in self.decoding.items():
            tokens[row, 0], pos[row] = seq.feed, seq.pos
        name = "decode_slots" if k == self.slots else f"decode_slots_{k}"
        out = self.program.run_on_device(tokens, pos, signature_name=name, **self.caches)
        self.calls[name] += 1
        self.caches = {k: out[k] for k in self.rows.names()}
        logits = numpy_to_torch(np.asarray(out["logits"]))
        self.steps += 1
        ended = []
        for row, seq in list(self.decoding.items()):
            if self._take(seq, logits[row, 0]):
                del self.decoding[row]
                self.free.append(row)
                ended.append(seq)
        return ended

    def _decode_solo(self) -> list:
        import torch

        seq = self.solo
        out = self.runtime(torch.tensor([[seq.feed]], dtype=torch.int32), torch.tensor([seq.pos], dtype=torch.int32),
                           signature_name="decode", **seq.caches)
        self.calls["decode"] += 1
        seq.caches = {k: out[k] for k in self.spec.names()}
        self.steps += 1
        if not self._take(seq, torch.as_tensor(out["logits"])[0, 0]):
            return []
        self.solo, seq.caches = None, None
        self.free.append(seq.slot)
        return [seq]

    @staticmethod
    def _take(seq: SlotSeq, logits) -> bool:
        """The next token from ``logits`` (the row's, [vocab]) by the request's own sampler; True when it ends."""
        tok = seq.pick(logits.float())
        seq.tokens.append(tok)
        if seq.first_token_s is None:
            seq.first_token_s = time.perf_counter()
        stop = seq.on_token(tok) if seq.on_token is not None else False
        if tok in seq.stops or stop:
            seq.finish = "stop"
        elif len(seq.tokens) >= seq.max_tokens:
            seq.finish = "length"
        else:
            seq.feed, seq.pos = tok, seq.pos + 1
            return False
        return True

    def warm_up(self) -> None:
        """Run insert_slot, slots_prefill_<L> and decode_slots once on zeros (PJRT compiles a signature on its
        first call)."""
        import torch

        self._ensure_caches()
        new = {f"new_{n}": v for n, v in self.spec.zeros().items()}
        self.caches = dict(self.program.run_on_device(torch.zeros(1, dtype=torch.int32), signature_name="insert_slot",
                                                      **self.caches, **new))
        for L, k in self.many.items():
            out = self.program.run_on_device(torch.zeros(k, L, dtype=torch.int32), torch.arange(L, dtype=torch.int32),
                                             torch.arange(k, dtype=torch.int32), signature_name=f"slots_prefill_{L}",
                                             **self.caches)
            self.caches = {n: out[n] for n in self.rows.names()}
        for k in self.sizes:
            out = self.program.run_on_device(torch.zeros(k, 1, dtype=torch.int32), torch.zeros(k, dtype=torch.int32),
                                             signature_name="decode_slots" if k == self.slots else f"decode_slots_{k}",
                                             **self.caches)
            self.caches = {n: out[n] for n in self.rows.names()}

    def run(self, seqs: list) -> list:
        """Every one of ``seqs`` to its end, joining free rows as others leave; returns ``seqs``."""
        waiting = collections.deque(seqs)
        while waiting or self.prefilling or self.decoding or self.solo is not None:
            while waiting and self.free:
                self.add(waiting.popleft())
            self.step()
        return seqs


class SlotScheduler:
    """The server's worker for a slotted LM, in the place of a Batcher: requests wait in a bounded queue, join free
    rows between decode steps and leave on a stop token or string, ``max_tokens``, a hang-up or the deadline. One
    thread runs the engine; results go back to the event loop. ``start_job(job) -> (SlotSeq, finish)`` makes a
    job's SlotSeq and ``finish(seq or Aborted) -> result`` its answer (LMModel's)."""

    def __init__(self, name: str, model, *, max_queue: int, metrics=None):
        self.name, self.model, self.max_queue, self._metrics = name, model, max_queue, metrics
        self.max_rows = model.slots
        self._lock = threading.Condition()
        self._inbox: collections.deque = collections.deque()  # jobs, and ("call", fn, future) items
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.waiting = 0
        self.running = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._work, name=f"serve-{self.name}", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def call_in_thread(self, fn: Callable, *args) -> asyncio.Future:
        """Run ``fn`` on the engine's thread between steps (warm-up compiles)."""
        fut = asyncio.get_running_loop().create_future()
        with self._lock:
            self._inbox.append(("call", lambda: fn(*args), fut))
            self._lock.notify()
        return fut

    def submit(self, job) -> asyncio.Future:
        from ._batcher import QueueFull

        if self.waiting >= self.max_queue:
            if self._metrics is not None:
                self._metrics.rejected.labels(self.name, "queue_full").inc()
            raise QueueFull(self.name)
        job.future = asyncio.get_running_loop().create_future()
        with self._lock:
            self.waiting += 1
            self._inbox.append(job)
            self._lock.notify()
        self._gauge()
        return job.future

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.name).set(self.waiting)
            self._metrics.running.labels(self.name).set(self.running)

    def _settle(self, fut: asyncio.Future, result, error: bool = False) -> None:
        def settle():
            if not fut.done():
                (fut.set_exception if error else fut.set_result)(result)

        self._loop.call_soon_threadsafe(settle)

    def _work(self) -> None:
        from ._models import Aborted

        engine = self.model.engine
        live: dict = {}  # SlotSeq -> (job, its text stream)
        held = collections.deque()  # jobs taken off the inbox that wait for a free row
        while True:
            with self._lock:
                while not self._stopping and not self._inbox and not live and not held:
                    self._lock.wait()
                if self._stopping:
                    break
                items = list(self._inbox)
                self._inbox.clear()
            for item in items:
                if isinstance(item, tuple):
                    _, fn, fut = item
                    try:
                        self._settle(fut, fn())
                    except Exception as e:  # noqa: BLE001 - handed to the caller's future
                        self._settle(fut, e, error=True)
                else:
                    held.append(item)
            for job in [j for j in held if j.future.done()]:  # given up on while waiting for a row
                held.remove(job)
                with self._lock:
                    self.waiting -= 1
            while held and engine.free:  # new requests join free rows
                job = held.popleft()
                with self._lock:
                    self.waiting -= 1
                if job.future.done():
                    continue
                if job.dead():
                    self._settle(job.future, Aborted("disconnect" if job.cancel.is_set() else "deadline"))
                    continue
                try:
                    seq, stream = self.model.start_seq(job)
                    engine.add(seq)
                except Exception as e:  # noqa: BLE001 - this request's own error
                    self._settle(job.future, e)
                    continue
                live[seq] = (job, stream)
            for seq, (job, _) in list(live.items()):  # hang-ups and deadlines leave between steps
                if job.future.done() or job.dead():
                    engine.drop(seq)
                    del live[seq]
                    self._settle(job.future, Aborted("disconnect" if job.cancel.is_set() else "deadline"))
            self.running = len(live)
            self._gauge()
            if not live:
                continue
            if self._metrics is not None and engine.decoding:
                self._metrics.batch_rows.labels(self.name).observe(len(engine.decoding))
                self._metrics.batch_requests.labels(self.name).observe(len(engine.decoding))
            try:
                ended = engine.step()
            except Exception as e:  # noqa: BLE001 - the model failed: every request in it gets the error
                for seq, (job, _) in live.items():
                    engine.drop(seq)
                    self._settle(job.future, e)
                live.clear()
                continue
            for seq in ended:
                job, stream = live.pop(seq)
                self._settle(job.future, self.model.finish_seq(seq, stream))
        for job, _ in live.values():  # stopping: nobody waits for these any more
            self._settle(job.future, Aborted("deadline"))
        for job in held:
            self._settle(job.future, Aborted("deadline"))
