"""The shared gate: every replica's requests on a backend, counted in Redis.

Per backend, two sorted sets hold the reservations of every replica: ``await`` (sent, no
token yet) and ``flight`` (sent, not ended). A member is ``<replica>|<n>``; its score is the
time (Redis's own clock, milliseconds) its lease runs out. Expired members are dropped by
every reservation, so a replica killed with SIGKILL holds nothing longer than a lease. The
owning replica renews its members every third of a lease.

A claim is one Lua script, atomic in Redis: drop expired members, add the member to both sets
and return the counts found before it, so each claim sees exactly the members added before it.
The replica then asks its configured gate plugin with those counts and withdraws the member
if the gate refuses (:mod:`.launcher`); the rule stays the plugin's, not the script's. The
script can also refuse by itself, on an in-flight cap and a threshold of waiting requests
(:meth:`SharedGate.reserve`). A release (first token: out of ``await``; end: out of both) is a
script too: it removes the member and publishes the counts it leaves behind, so every replica learns
of the freed slot at once, without reading the sets again. A preemption hands its victim's slot
to the request it starts (:meth:`SharedGate.take_over`): the member stays in ``flight``
throughout, so no other replica ever sees the slot free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fairq_server.cluster.connection import ScriptCall, run_scripts

__all__ = ["GlobalCounts", "SharedGate", "parse_announcement"]

_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000) "

# KEYS: await, flight. ARGV: member, lease ms, others waiting, threshold (0: none), in-flight
# cap (0: none). Returns {granted 0/1, awaiting, in flight} (after the reservation, if granted).
_RESERVE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local awaiting = redis.call('ZCARD', KEYS[1])
local flight = redis.call('ZCARD', KEYS[2])
local cap = tonumber(ARGV[5])
local threshold = tonumber(ARGV[4])
if (cap > 0 and flight >= cap) or (threshold > 0 and tonumber(ARGV[3]) + awaiting >= threshold) then
  return {0, awaiting, flight}
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * lease)
redis.call('PEXPIRE', KEYS[2], 2 * lease)
return {1, awaiting + 1, flight + 1}
"""
)

# KEYS: await, flight. ARGV: lease ms, (member, '1' still awaiting its first token / '0')*.
# Sets every member the replica holds, lease renewed: a member that vanished (Redis restarted
# empty, or its lease ran out while the replica was stopped) is put back, since its request
# is still on the backend and the counts must say so.
_RENEW = (
    _NOW
    + """
local lease = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '1' then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
  else
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
  redis.call('ZADD', KEYS[2], now + lease, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], 2 * lease)
redis.call('PEXPIRE', KEYS[2], 2 * lease)
return 1
"""
)

# KEYS: await, flight. ARGV: member, channel, '1' to leave flight too (the request ended).
# Publishes and returns "<awaiting> <in flight>" of live members after the removal.
_RELEASE = (
    _NOW
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[3] == '1' then redis.call('ZREM', KEYS[2], ARGV[1]) end
local counts = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') .. ' '
  .. redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
redis.call('PUBLISH', ARGV[2], counts)
return counts
"""
)

# KEYS: await, flight. ARGV: member, lease ms. If the member is live in flight: back into await
# (its new request has no token yet), both leases renewed; returns {1, awaiting, in flight}
# found before it. Else {0, 0, 0}: its lease ran out (or Redis lost it), the slot is gone.
_TAKE_OVER = (
    _NOW
    + """
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then return {0, 0, 0} end
redis.call('ZREM', KEYS[1], ARGV[1])
local awaiting = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local flight = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf') - 1
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * lease)
redis.call('PEXPIRE', KEYS[2], 2 * lease)
return {1, awaiting, flight}
"""
)

# KEYS: await, flight. Counts of live (unexpired) members.
_COUNT = (
    _NOW
    + """
return {redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'),
        redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')}
"""
)


@dataclass(frozen=True)
class GlobalCounts:
    """Every replica's requests on one backend: without a token yet, and not ended."""

    awaiting: int
    in_flight: int


def parse_announcement(channel: str, data: str, prefix: str) -> tuple[str, GlobalCounts] | None:
    """Read a release announcement: the backend and the counts left (None: not one)."""
    head = f"{prefix}:gate-released:"
    if not channel.startswith(head):
        return None
    try:
        awaiting, in_flight = (int(x) for x in data.split())
    except ValueError:
        return None
    if awaiting < 0 or in_flight < 0:
        return None
    return channel[len(head) :], GlobalCounts(awaiting, in_flight)


class SharedGate:
    """The Redis side of the shared gate (stateless: the caller keeps its members).

    Args:
        client: the replica's Redis client.
        prefix: key prefix of this cluster.
        lease_seconds: how long a reservation lives without renewal.

    """

    def __init__(self, client: aioredis.Redis, prefix: str, lease_seconds: float) -> None:
        self._client = client
        self._prefix = prefix
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._reserve = client.register_script(_RESERVE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._count = client.register_script(_COUNT)
        self._take_over = client.register_script(_TAKE_OVER)

    def _keys(self, backend_id: str) -> list[str]:
        base = f"{self._prefix}:gate:{backend_id}"
        return [f"{base}:await", f"{base}:flight"]

    def channel(self, backend_id: str = "*") -> str:
        """Return the channel of releases on ``backend_id`` (``*``: a pattern)."""
        return f"{self._prefix}:gate-released:{backend_id}"

    async def claim(
        self, backend_id: str, member: str, extra: Sequence[ScriptCall] = ()
    ) -> tuple[GlobalCounts, list[Any]]:
        """Add ``member`` on ``backend_id``; return the live counts found before it.

        ``extra`` script calls (a quota reservation) ride in the same round trip; their
        replies come back in order.
        """
        args: list[str | int | float] = [member, self._lease_ms, repr(0.0), 0, 0]
        first, *rest = await run_scripts(
            self._client, [(self._reserve, self._keys(backend_id), args), *extra]
        )
        _, awaiting, flight = first
        return GlobalCounts(int(awaiting) - 1, int(flight) - 1), rest

    async def reserve(
        self,
        backend_id: str,
        member: str,
        others_waiting: float = 0.0,
        threshold: int = 0,
        cap: int = 0,
    ) -> tuple[bool, GlobalCounts]:
        """Take a slot on ``backend_id`` unless the cap or threshold (0: none) is reached.

        ``others_waiting`` (other clients' waiting requests) plus every replica's tokenless
        requests must stay below ``threshold``. Returns the counts too (after the slot).
        """
        granted, awaiting, flight = await self._reserve(
            keys=self._keys(backend_id),
            args=[member, self._lease_ms, repr(float(others_waiting)), threshold, cap],
        )
        return bool(granted), GlobalCounts(int(awaiting), int(flight))

    async def take_over(
        self, backend_id: str, member: str, extra: Sequence[ScriptCall] = ()
    ) -> tuple[GlobalCounts | None, list[Any]]:
        """Keep ``member``'s slot for a new request (a preemption's); None: it is gone.

        One script: the member never leaves ``flight``, so no reservation anywhere finds the
        slot free in between. Returns the live counts found without the member, and the
        replies of ``extra`` calls sent in the same round trip (as :meth:`claim`'s).
        """
        call: ScriptCall = (self._take_over, self._keys(backend_id), [member, self._lease_ms])
        (kept, awaiting, flight), *rest = await run_scripts(self._client, [call, *extra])
        return (GlobalCounts(int(awaiting), int(flight)) if int(kept) else None), rest

    async def reserve_slot(
        self, backend_id: str, member: str, extra: Sequence[ScriptCall], *, handed: bool
    ) -> tuple[GlobalCounts, list[Any], bool]:
        """Claim a slot, or keep a preempted request's (``handed``), with ``extra`` calls.

        Returns the counts found, the replies of ``extra`` and whether a handed slot was
        kept. The extra calls ride with the first script; after a hand-over that found the
        slot gone, the claim goes without them (they ran already).
        """
        if handed:
            kept, replies = await self.take_over(backend_id, member, extra)
            if kept is not None:
                return kept, replies, True
            counts, _ = await self.claim(backend_id, member)
            return counts, replies, False
        counts, replies = await self.claim(backend_id, member, extra)
        return counts, replies, False

    async def first_token(self, backend_id: str, member: str) -> GlobalCounts:
        """Mark that the request produced a token: it no longer waits in the backend's queue.

        Returns the counts left, which every replica is told too.
        """
        return await self._leave(backend_id, member, ended=False)

    async def release(self, backend_id: str, member: str) -> GlobalCounts:
        """Free the slot of a request that ended (any way); return the counts left."""
        return await self._leave(backend_id, member, ended=True)

    async def _leave(self, backend_id: str, member: str, *, ended: bool) -> GlobalCounts:
        args = [member, self.channel(backend_id), "1" if ended else "0"]
        counts = await self._release(keys=self._keys(backend_id), args=args)
        text = counts.decode() if isinstance(counts, bytes) else str(counts)
        awaiting, in_flight = (int(x) for x in text.split())
        return GlobalCounts(awaiting, in_flight)

    async def renew(self, held: Mapping[str, Mapping[str, bool]]) -> None:
        """Set and extend every member held, per backend, in one round trip.

        ``held`` maps each backend to its members and whether each still awaits its first
        token.
        """
        calls: list[ScriptCall] = []
        for backend_id, members in held.items():
            if members:
                args: list[str | int | float] = [self._lease_ms]
                for member, awaiting in members.items():
                    args += [member, "1" if awaiting else "0"]
                calls.append((self._renew, self._keys(backend_id), args))
        if calls:
            await run_scripts(self._client, calls)

    async def counts(self, backend_ids: Sequence[str]) -> dict[str, GlobalCounts]:
        """Every replica's live reservations on each of ``backend_ids``, in one round trip."""
        if not backend_ids:
            return {}
        rows = await run_scripts(
            self._client, [(self._count, self._keys(b), []) for b in backend_ids]
        )
        return {
            b: GlobalCounts(int(r[0]), int(r[1])) for b, r in zip(backend_ids, rows, strict=True)
        }
