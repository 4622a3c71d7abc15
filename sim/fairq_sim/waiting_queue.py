"""The engine's waiting queue: first come first served, or by priority.

Both policies share one small interface: ``add``, ``prepend`` (a preempted request goes back
to the front under FCFS; under priority its key already places it), ``peek``, ``pop``,
``remove``, ``len`` and iteration in service order. ``pop`` and ``peek`` on an empty queue
raise ``IndexError``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from fairq_sim.request import SimRequest

__all__ = ["FcfsQueue", "PriorityQueue", "WaitingQueue", "create_waiting_queue"]


class WaitingQueue(Protocol):
    """Requests waiting for a slot, in the order the engine will serve them."""

    def add(self, request: SimRequest) -> None:
        """Queue a newly arrived request."""

    def prepend(self, request: SimRequest) -> None:
        """Re-queue a preempted request so it is served before later arrivals."""

    def peek(self) -> SimRequest:
        """Return the next request without removing it."""

    def pop(self) -> SimRequest:
        """Remove and return the next request."""

    def remove(self, request: SimRequest) -> None:
        """Remove ``request`` wherever it is (abort)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[SimRequest]: ...


class FcfsQueue:
    """First come, first served; preempted requests go back to the front."""

    def __init__(self) -> None:
        self._items: deque[SimRequest] = deque()

    def add(self, request: SimRequest) -> None:
        """Append ``request`` at the back."""
        self._items.append(request)

    def prepend(self, request: SimRequest) -> None:
        """Put ``request`` at the front."""
        self._items.appendleft(request)

    def peek(self) -> SimRequest:
        """Return the front request."""
        if not self._items:
            raise IndexError("peek from an empty waiting queue")
        return self._items[0]

    def pop(self) -> SimRequest:
        """Remove and return the front request."""
        if not self._items:
            raise IndexError("pop from an empty waiting queue")
        return self._items.popleft()

    def remove(self, request: SimRequest) -> None:
        """Remove ``request``; ``ValueError`` if absent."""
        self._items.remove(request)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(self._items)


class PriorityQueue:
    """Lowest ``priority`` first; ties by arrival time, then arrival order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, SimRequest]] = []

    def add(self, request: SimRequest) -> None:
        """Insert ``request`` by its key."""
        key = (request.priority, request.arrival_time, request.arrival_seq, request)
        heapq.heappush(self._heap, key)

    def prepend(self, request: SimRequest) -> None:
        """Insert a preempted request; its original arrival keeps its place."""
        self.add(request)

    def peek(self) -> SimRequest:
        """Return the request with the smallest key."""
        if not self._heap:
            raise IndexError("peek from an empty waiting queue")
        return self._heap[0][3]

    def pop(self) -> SimRequest:
        """Remove and return the request with the smallest key."""
        if not self._heap:
            raise IndexError("pop from an empty waiting queue")
        return heapq.heappop(self._heap)[3]

    def remove(self, request: SimRequest) -> None:
        """Remove ``request``; ``ValueError`` if absent. O(n), aborts are rare."""
        for i, entry in enumerate(self._heap):
            if entry[3] is request:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError("request not in waiting queue")

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[SimRequest]:
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))


def create_waiting_queue(policy: str) -> WaitingQueue:
    """Return an empty queue for ``policy`` (``fcfs`` or ``priority``).

    Raises:
        ValueError: For an unknown policy, listing the valid ones.

    """
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; valid: fcfs, priority")
