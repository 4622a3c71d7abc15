"""A continuous-batching inference engine, as pure logic over an injectable clock.

Every step the scheduler builds a batch the way vLLM's V1 scheduler does:

1. Running requests first, in order. Each needs its remaining uncomputed tokens (one while
   decoding; a chunk while prefilling), within the step's token budget. When the KV cache
   cannot hold them a running request is preempted: the last one admitted (FCFS) or the one
   with the largest ``(priority, arrival)`` (priority mode). A preempted request drops its
   blocks and goes back to the waiting queue to be recomputed, output kept.
2. Then, if nothing was preempted, waiting requests in queue order while there are fewer than
   ``max_num_seqs`` running, budget is left, and their blocks fit. Full blocks already in the
   prefix cache are reused and not computed. The head of the queue blocks the rest: no
   skipping ahead.

The step lasts ``(alpha + beta * batch_size + gamma * prefill_tokens) / speed`` seconds. When
it ends, every request whose tokens are all computed samples one new token.

The engine never sleeps; a driver (``runner.EngineRunner``, or a test with a
``ManualClock``) calls :meth:`Engine.schedule`, lets the step's duration pass, then calls
:meth:`Engine.finish_step`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from fairq_sim.clock import Clock
from fairq_sim.events import EngineObserver, StepPlan, TokenOutput
from fairq_sim.kv_cache import KvCache
from fairq_sim.profiles import Profile
from fairq_sim.request import FinishReason, RequestStatus, SimRequest
from fairq_sim.tokens import EOS_TOKEN_ID, eos_position, mix64, sample_token, token_text
from fairq_sim.waiting_queue import create_waiting_queue

__all__ = ["Engine", "EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """Parameters of one simulated engine.

    Attributes:
        profile: Step-time model and capacity.
        speed: Clock factor dividing every step duration.
        policy: ``fcfs`` or ``priority``.
        eos_mean_tokens: Mean output length before an EOS for requests without ``ignore_eos``;
            None means no EOS (requests run to ``max_tokens``).
        seed: Seed for EOS positions.

    """

    profile: Profile
    speed: float = 1.0
    policy: str = "fcfs"
    eos_mean_tokens: float | None = None
    seed: int = 0


class Engine:
    """Simulated continuous-batching engine.

    Args:
        config: Engine parameters.
        clock: Returns the current time in seconds.
        observer: Receives scheduling, token and completion callbacks (metrics).

    """

    def __init__(
        self, config: EngineConfig, clock: Clock, observer: EngineObserver | None = None
    ) -> None:
        self.config = config
        self.profile = config.profile
        self.kv = KvCache(config.profile.kv_blocks, config.profile.block_size)
        self.observer = observer or EngineObserver()
        self._clock = clock
        self._waiting = create_waiting_queue(config.policy)
        self._running: list[SimRequest] = []
        self._requests: dict[str, SimRequest] = {}
        self._arrivals = itertools.count()
        self.num_preemptions = 0
        # The longest waiting queue left after a step's scheduling: what a scraper sampling
        # vllm:num_requests_waiting at every step would see at most (benchmarks read it
        # instead of sampling /metrics themselves).
        self.peak_waiting = 0
        # Mutable so a running simulator can be sped up or slowed down between steps.
        self.speed = config.speed

    @property
    def num_running(self) -> int:
        """Requests holding a batch slot."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue (new and preempted)."""
        return len(self._waiting)

    @property
    def running_count(self) -> int:
        """Alias of :attr:`num_running`."""
        return len(self._running)

    @property
    def waiting_count(self) -> int:
        """Alias of :attr:`num_waiting`."""
        return len(self._waiting)

    @property
    def running(self) -> list[SimRequest]:
        """Running requests in scheduling order (a copy)."""
        return list(self._running)

    @property
    def waiting(self) -> list[SimRequest]:
        """Waiting requests in service order (a copy)."""
        return list(self._waiting)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._requests)

    def get(self, request_id: str) -> SimRequest | None:
        """Return the unfinished request with this id, if any."""
        return self._requests.get(request_id)

    def add_request(self, request: SimRequest) -> None:
        """Queue ``request``, stamping its arrival.

        Raises:
            ValueError: If the id is in use, ``max_tokens`` < 1, or prompt plus ``max_tokens``
                exceeds ``max_model_len`` (the HTTP layer validates before this).

        """
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if request.num_prompt_tokens + request.max_tokens > self.profile.max_model_len:
            raise ValueError("prompt plus max_tokens exceeds max_model_len")
        request.arrival_time = self._clock()
        request.arrival_seq = next(self._arrivals)
        request.status = RequestStatus.WAITING
        if not request.ignore_eos and self.config.eos_mean_tokens is not None:
            seed = mix64(self.config.seed, request.arrival_seq)
            request.eos_at = eos_position(seed, self.config.eos_mean_tokens)
        self._requests[request.request_id] = request
        self._waiting.add(request)

    def abort_request(self, request_id: str) -> bool:
        """Remove a request wherever it is and free its blocks.

        Returns:
            False if no unfinished request has this id.

        """
        request = self._requests.get(request_id)
        if request is None:
            return False
        if request.status is RequestStatus.RUNNING:
            self._running.remove(request)
        else:
            self._waiting.remove(request)
        self._finish(request, FinishReason.ABORT, self._clock())
        return True

    def schedule(self) -> StepPlan | None:
        """Pick the next batch and allocate its KV blocks.

        Returns:
            The step, or None when there is nothing to run.

        """
        now = self._clock()
        budget = self.profile.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []

        i = 0
        while i < len(self._running) and budget > 0:
            request = self._running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.kv.allocate(request, num_new):
                victim = self._pick_victim()
                victim_index = self._running.index(victim)
                self._preempt(victim)
                preempted.append(victim)
                for j, (scheduled_request, n) in enumerate(scheduled):
                    if scheduled_request is victim:
                        del scheduled[j]
                        budget += n
                        break
                if victim is request:
                    break
                if victim_index < i:
                    i -= 1
            else:
                scheduled.append((request, num_new))
                budget -= num_new
                i += 1
                continue
            break  # the current request preempted itself: nothing more fits

        # vLLM admits nothing new in a step that had to preempt, unless the batch is empty.
        if not preempted or not scheduled:
            budget = self._schedule_waiting(scheduled, budget)
        self.peak_waiting = max(self.peak_waiting, len(self._waiting))

        if not scheduled:
            return None
        prefill = sum(n for r, n in scheduled if not _is_decoding(r, n))
        duration = self.profile.step_seconds(len(scheduled), prefill) / self.speed
        return StepPlan(scheduled, prefill, now, duration, preempted)

    def finish_step(self, plan: StepPlan) -> list[TokenOutput]:
        """Apply a step: advance computed tokens, sample, finish requests.

        Requests aborted while the step ran are skipped.

        Returns:
            One output per request that produced a token, in batch order.

        """
        now = self._clock()
        outputs: list[TokenOutput] = []
        for request, num_new in plan.scheduled:
            if request.status is not RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += num_new
            self.kv.cache_full_blocks(request)
            if request.num_computed_tokens < request.num_tokens:
                continue  # a chunk of a long prefill; no token yet
            outputs.append(self._sample(request, now))
        self.observer.on_step(plan)
        return outputs

    def _schedule_waiting(self, scheduled: list[tuple[SimRequest, int]], budget: int) -> int:
        now = self._clock()
        while self._waiting and budget > 0 and len(self._running) < self.profile.max_num_seqs:
            request = self._waiting.peek()
            hits: list[int] = []
            if request.num_computed_tokens == 0:
                hits = self.kv.find_prefix_hits(request)
            hit_tokens = len(hits) * self.kv.block_size
            num_new = min(request.num_tokens - hit_tokens, budget)
            if not self.kv.allocate(request, num_new, hits):
                break
            self._waiting.pop()
            request.num_computed_tokens = hit_tokens
            if request.scheduled_time is None:
                request.scheduled_time = now
                request.num_cached_tokens = hit_tokens
            request.status = RequestStatus.RUNNING
            self._running.append(request)
            scheduled.append((request, num_new))
            budget -= num_new
            self.observer.on_scheduled(request, request.num_tokens, hit_tokens)
        return budget

    def _pick_victim(self) -> SimRequest:
        if self.config.policy == "priority":
            return max(self._running, key=lambda r: (r.priority, r.arrival_time, r.arrival_seq))
        return self._running[-1]

    def _preempt(self, request: SimRequest) -> None:
        self._running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self._waiting.prepend(request)
        self.num_preemptions += 1
        self.observer.on_preempted(request)

    def _sample(self, request: SimRequest, now: float) -> TokenOutput:
        index = request.num_output_tokens + 1
        if request.eos_at == index:
            token_id = EOS_TOKEN_ID
        else:
            token_id = sample_token(request.seed, index - 1)
        text = token_text(token_id)
        request.output_token_ids.append(token_id)

        reason: FinishReason | None = None
        if token_id == EOS_TOKEN_ID:
            reason = FinishReason.STOP
        elif request.stop:
            reason = self._match_stop(request, text)
        request.output_text += text
        if reason is None and (
            index >= request.max_tokens or request.num_tokens >= self.profile.max_model_len
        ):
            reason = FinishReason.LENGTH
        output = TokenOutput(request, token_id, text, index, now, reason is not None)
        # Observers see the previous token's time in last_token_time (inter-token latency).
        self.observer.on_token(output)
        if request.first_token_time is None:
            request.first_token_time = now
        request.last_token_time = now
        if reason is not None:
            self._running.remove(request)
            self._finish(request, reason, now)
        return output

    def _match_stop(self, request: SimRequest, text: str) -> FinishReason | None:
        # Only the tail can contain a stop string that this token completed.
        longest = max(len(s) for s in request.stop)
        tail = request.output_text[-(longest - 1) :] if longest > 1 else ""
        window = tail + text
        for stop in request.stop:
            if stop and stop in window:
                request.stop_reason = stop
                return FinishReason.STOP
        return None

    def _finish(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = now
        del self._requests[request.request_id]
        self.observer.on_finished(request)


def _is_decoding(request: SimRequest, num_new: int) -> bool:
    """Whether a scheduled request is computing just its last sampled token."""
    return num_new == 1 and request.num_output_tokens > 0
