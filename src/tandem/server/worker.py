"""The one thread that owns the Engine: hands queued requests to its scheduler, has it admit
what free slots can take, steps every active slot together (one batched target forward per
step), and hands each request its text as it becomes safe to show, then its final result.

The HTTP side never touches the engine. It submits a Job and reads the Job's asyncio queue;
the worker pushes events into that queue with loop.call_soon_threadsafe:

    Delta(text, tokens, origins, pieces, ...)   streamed jobs only, after each step
    Done(result)                                the finished request (llama.cpp's /completion dict)
    Failed(ApiError)                            this request only; the others carry on

Cancelling (a client that went away) sets a flag; the worker frees the slot before its next
step. A job waits at most `timeout` seconds in total (queue + generation).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import TandemError
from .metrics import Metrics
from .results import completion_result, slot_view
from .schemas import ApiError

if TYPE_CHECKING:  # the engine (and torch) load in the background, after the socket listens
    from ..engine import Engine, Request, Sequence
    from ..sampling import TokenLogprobs

log = logging.getLogger("tandem.server")


@dataclass(slots=True)
class Delta:
    """What one step added to a streamed request: the text now safe to show, and per new token
    its id, who proposed it ("target", "draft", "eagle3", "suffix", "ngram", "grammar") and the
    text it added (the pieces join to the generated text; `text` may hold back a possible
    stop)."""

    text: str
    tokens: list[int]
    origins: list[str]
    pieces: list[str]
    logprobs: list[TokenLogprobs]
    timings: dict | None = None  # the sequence's timings so far (timings_per_token)

    @property
    def from_draft(self) -> list[bool]:
        return [o != "target" for o in self.origins]


@dataclass(slots=True)
class Progress:
    """How far a streamed job's prompt has been read (llama-server's prompt_progress), sent
    when asked for (return_progress): when it is admitted, after each pass that read some of
    it, and when its first token comes (processed == total)."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def as_dict(self) -> dict:
        return {"total": self.total, "cache": self.cache, "processed": self.processed,
                "time_ms": self.time_ms}


@dataclass(slots=True)
class Done:
    result: dict


@dataclass(slots=True)
class Failed:
    error: ApiError


_ids = itertools.count()


@dataclass(eq=False)
class Job:
    request: Request
    stream: bool
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which the job fails with a timeout
    timeout: float
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    id: int = field(default_factory=lambda: next(_ids))
    progress: bool = False  # send Progress events (return_progress)
    cancelled: bool = False  # set by the HTTP side, read by the worker
    finished: bool = False  # set by the worker when Done/Failed was pushed
    seq: Sequence | None = None
    reported: int = -1  # prompt tokens the last Progress said were processed

    def push(self, event: Delta | Progress | Done | Failed) -> None:
        if isinstance(event, (Done, Failed)):
            self.finished = True
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass


class QueueFull(Exception):
    pass


class Worker:
    """Owns `engine`; `submit` and `cancel` are the only calls from other threads. The engine's
    scheduler decides who waits and who runs (engine/scheduler.py); the worker only moves
    jobs in (its inbox, a thread-safe queue) and their events out."""

    def __init__(self, engine: Engine, metrics: Metrics, max_queue: int) -> None:
        self.engine, self.metrics, self.max_queue = engine, metrics, max_queue
        self._cond = threading.Condition()
        self._inbox: deque[Job] = deque()  # submitted, not yet handed to the engine
        self._jobs: dict[int, Job] = {}  # id(seq) -> job, for the engine's sequences
        self._waiting = 0  # of them, waiting for a slot (read by submit)
        self._calls: deque[tuple] = deque()  # (fn, future): run on this thread between steps
        self._stopping = False
        self._slots_view: list[dict] = []
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)

    # -- called from the HTTP side ----------------------------------------------------------

    def start(self) -> None:
        self._publish()
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def submit(self, jobs: list[Job]) -> None:
        """Queue one request's jobs, all or none. They fit when the queue keeps within
        --queue-size, or when nothing else waits (a request with more answers than the queue
        holds is then served alone, not refused forever)."""
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            waiting = len(self._inbox) + self._waiting
            if waiting and waiting + len(jobs) > self.max_queue:
                raise QueueFull(
                    f"the server is busy: all {len(self.engine.slots)} slot(s) are generating and "
                    f"{waiting} request(s) are already waiting (the most it queues, "
                    "--queue-size); retry later")
            self._inbox.extend(jobs)
            self.metrics.queue(len(self._jobs) - self._waiting, waiting + len(jobs))
            self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        with self._cond:
            job.cancelled = True
            if job in self._inbox:
                self._inbox.remove(job)
                job.finished = True
            self._cond.notify_all()

    def call(self, fn) -> concurrent.futures.Future:
        """Run fn() on the engine's thread between two steps (embeddings, slot files): the
        one way other threads touch the engine. The future holds its result or exception."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            self._calls.append((fn, fut))
            self._cond.notify_all()
        return fut

    def slots(self) -> list[dict]:
        """A snapshot of the slots, taken by the worker after its last step."""
        return self._slots_view

    # -- the worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._inbox or self._jobs or self._calls):
                    self._cond.wait()
                if self._stopping:
                    break
            try:
                self._iterate()
            except Exception:  # a bug in the loop itself: fail what is running, keep serving
                log.error("engine loop error:\n%s", traceback.format_exc())
                self._fail_running(ApiError(500, "internal error in the generation loop"))
        self._shutdown()

    def _iterate(self) -> None:
        self._run_calls()
        self._take_inbox()
        self._expire()
        self._reap_cancelled()
        while (seq := self.engine.next_admissible()) is not None:
            self._admit(self._jobs[id(seq)])
        if self.engine.active():
            self._step()
        else:  # only jobs waiting for a slot someone else holds: do not spin
            with self._cond:
                self._cond.wait(0.05)
        self._publish()

    def _run_calls(self) -> None:
        while True:
            with self._cond:
                if not self._calls:
                    return
                fn, fut = self._calls.popleft()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # handed to the caller, who answers with it
                    fut.set_exception(e)

    def _take_inbox(self) -> None:
        """Hand the new jobs' requests to the engine's waiting list (a request the engine
        refuses fails now)."""
        with self._cond:
            jobs = list(self._inbox)
            self._inbox.clear()
        for job in jobs:
            try:
                job.seq = self.engine.submit(job.request)
            except TandemError as e:
                job.push(Failed(ApiError(400, str(e))))
                continue
            except Exception as e:
                log.error("request %d failed while processing its prompt:\n%s", job.id,
                          traceback.format_exc())
                job.push(Failed(ApiError(500, f"internal error while processing the prompt: "
                                              f"{e}")))
                continue
            self._jobs[id(job.seq)] = job
        self._queue_gauges()

    def _admit(self, job: Job) -> None:
        seq = job.seq
        try:
            self.engine.start(seq)
        except TandemError as e:
            self._jobs.pop(id(seq))
            job.push(Failed(ApiError(400, str(e))))
            return
        except Exception as e:
            self._jobs.pop(id(seq))
            log.error("request %d failed while processing its prompt:\n%s", job.id,
                      traceback.format_exc())
            job.push(Failed(ApiError(500, f"internal error while processing the prompt: {e}")))
            return
        if job.progress:
            self._push_progress(job)
        if seq.done:  # n_predict 0: nothing to generate
            self._finish(job)
        else:
            self.metrics.prompt()
        self._queue_gauges()

    def _running(self) -> list[Job]:
        """The jobs whose sequences hold a slot."""
        return [j for j in self._jobs.values() if not j.seq.waiting]

    def _step(self) -> None:
        n_active = len(self._running())
        try:
            seqs = self.engine.step()
        except Exception as e:
            log.error("generation step failed:\n%s", traceback.format_exc())
            self._fail_running(ApiError(500, f"internal error while generating: {e}"))
            return
        self.metrics.step(n_active)
        for job in self._running():
            if job.progress and job.reported < job.seq.n_prompt:
                self._push_progress(job)
        for seq in seqs:
            job = self._jobs.get(id(seq))
            if job is None:
                continue
            if job.stream:
                self._push_delta(job, seq)
            if seq.done:
                self._finish(job)
        self._queue_gauges()
    def _push_delta(self, job: Job, seq: Sequence) -> None:
        n = seq.n_new
        text = seq.take_text()
        if not (text or n):
            return
        at = len(seq.output) - n
        ends = seq.ends[at - 1:] if at else [0, *seq.ends]
        if seq.done:  # the text's end (what the decoder held back, or cut at a stop) is the last's
            ends[-1] = len(seq.text)
        pieces = [seq.text[a:b] for a, b in zip(ends, ends[1:])]
        job.push(Delta(text, seq.output[at:], seq.origins[at:], pieces,
                       seq.logprobs[len(seq.logprobs) - n:] if seq.req.n_probs else [],
                       seq.timings()))

    def _push_progress(self, job: Job) -> None:
        seq = job.seq
        # the last prompt token is read by the pass that gives the first token
        done = seq.output or seq.done
        processed = seq.n_prompt if done else seq.prefill_at
        if processed == job.reported:
            return
        job.reported = processed
        cache = seq.n_prompt - seq.n_prompt_processed
        job.push(Progress(seq.n_prompt, cache, processed,
                          1e3 * (time.perf_counter() - seq.t_start)))

    def _finish(self, job: Job) -> None:
        seq = job.seq
        self.engine.release(seq)
        self._jobs.pop(id(seq), None)
        if seq.error:  # the engine could not go on (--kv-unified: the shared context is full)
            log.info("request %d failed: %s", job.id, seq.error)
            job.push(Failed(ApiError(500, seq.error)))
            return
        self.metrics.finished(seq)
        log.info("request %d done: %s", job.id, _summary(seq))
        try:
            job.push(Done(completion_result(seq, self.engine)))
        except Exception as e:
            log.error("could not build the result:\n%s", traceback.format_exc())
            job.push(Failed(ApiError(500, f"internal error while building the result: {e}")))

    def _reap_cancelled(self) -> None:
        for job in list(self._jobs.values()):
            if job.cancelled:
                self.engine.cancel(job.seq)
                del self._jobs[id(job.seq)]
                job.finished = True
                if not job.seq.waiting:
                    log.info("request %d cancelled (client went away); slot %d freed", job.id,
                             job.seq.slot)
        self._queue_gauges()

    def _expire(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if job.deadline <= now:
                what = "waiting for a free slot" if job.seq.waiting else "generating"
                self.engine.cancel(job.seq)
                del self._jobs[id(job.seq)]
                job.push(Failed(_timeout(job, what)))

    def _fail_running(self, error: ApiError) -> None:
        for job in self._running():
            self.engine.cancel(job.seq)
            del self._jobs[id(job.seq)]
            job.push(Failed(error))
        self._queue_gauges()

    def _queue_gauges(self) -> None:
        with self._cond:
            self._waiting = sum(j.seq.waiting for j in self._jobs.values())
            self.metrics.queue(len(self._jobs) - self._waiting,
                               len(self._inbox) + self._waiting)

    def _publish(self) -> None:
        running = {j.seq.slot: j for j in self._running()}
        self._slots_view = [slot_view(self.engine, i, running.get(i))
                            for i in range(len(self.engine.slots))]

    def _shutdown(self) -> None:
        with self._cond:
            pending = list(self._inbox)
            self._inbox.clear()
        error = ApiError(503, "the server is shutting down")
        for job in pending + [j for j in self._jobs.values() if j.seq.waiting]:
            job.push(Failed(error))
        self._fail_running(error)
        with self._cond:
            calls = list(self._calls)
            self._calls.clear()
        for _, fut in calls:
            fut.cancel()


def _summary(seq: Sequence) -> str:
    t = seq.timings()
    line = (f"slot {seq.slot}, prompt {t['prompt_n']} tokens in {t['prompt_ms']:.0f} ms, "
            f"{t['predicted_n']} predicted in {t['predicted_ms']:.0f} ms "
            f"({t['predicted_per_second']:.1f} tok/s), stop: {seq.stop_type}")
    if seq.spec.enabled:
        line += f", drafts accepted {seq.stats.n_accepted}/{seq.stats.n_drafted}"
    return line


def _timeout(job: Job, what: str) -> ApiError:
    return ApiError(408, f"the request timed out after {job.timeout:g} s while {what} "
                         "(the server's --timeout)")
