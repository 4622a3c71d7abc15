"""Shared fairness counters: one hash of counters per model and tier, for every replica.

Each replica keeps its policies' counters locally (the dispatcher reads them on every pick)
and flushes what changed, in one round trip per sync for all its models and tiers: lifts as
"at least" (``max``), charges as ``HINCRBYFLOAT``. The same script returns the shared
counters of the replica's backlogged users and the global floor: the smallest counter any
other replica has backlogged (each replica's head, leased like a reservation so a dead
replica's head expires). A replica then serves a user only while its counter is within the
slack of that floor, so the slots of the shared gate go to the user furthest behind anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from fairq_server.scheduling import events as ev
from fairq_server.scheduling.fairness.counter import CounterFairness, Journal
from fairq_server.scheduling.interfaces import FairnessPolicy
from fairq_server.scheduling.policies import Policies

__all__ = ["SharedCounters", "SyncResult", "shared_policies"]


def shared_policies(
    policies: Policies, slack: float, on_backlogged: Callable[[], None]
) -> Policies:
    """Return ``policies`` whose counter policies journal their changes for the cluster.

    ``on_backlogged`` is told when a user becomes backlogged (its head may be the new floor).
    """
    make = policies.fairness

    def fairness() -> FairnessPolicy:
        policy = make()
        if isinstance(policy, CounterFairness):
            policy.journal = Journal()
            policy.slack = slack
            policy.on_backlogged = on_backlogged
        return policy

    return dataclasses.replace(policies, fairness=fairness)


# KEYS: counters hash, heads hash. ARGV: replica, lease ms, head ('' none), n floors,
# (user, floor)*, n deltas, (user, delta)*, users to read*. Returns {floor or '', values*}:
# the floor is the smallest head of the *other* replicas (this replica knows its own now).
_SYNC = """
local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[2])
local i = 4
local n = tonumber(ARGV[i]) i = i + 1
for _ = 1, n do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if cur < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  i = i + 2
end
n = tonumber(ARGV[i]) i = i + 1
for _ = 1, n do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. (now + lease))
end
local floor = nil
local heads = redis.call('HGETALL', KEYS[2])
for j = 1, #heads, 2 do
  local value, expiry = string.match(heads[j + 1], '(%S+) (%S+)')
  if tonumber(expiry) <= now then
    redis.call('HDEL', KEYS[2], heads[j])
  elseif heads[j] ~= ARGV[1] and (floor == nil or tonumber(value) < floor) then
    floor = tonumber(value)
  end
end
redis.call('PEXPIRE', KEYS[1], 3600000)
redis.call('PEXPIRE', KEYS[2], 2 * lease)
local out = {floor and tostring(floor) or ''}
for j = i, #ARGV do
  out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[j]) or '0'
end
return out
"""


@dataclass(frozen=True)
class SyncResult:
    """Shared counters of one tier's backlogged users here, and the global floor."""

    model: str
    tier: int
    counters: dict[str, float]
    floor: float | None


class SharedCounters:
    """The Redis side of shared fairness (stateless).

    Args:
        client: the replica's Redis client.
        prefix: key prefix of this cluster.
        replica: this replica's id (names its head).
        lease_seconds: a head not refreshed for this long no longer holds others back.

    """

    def __init__(
        self, client: aioredis.Redis, prefix: str, replica: str, lease_seconds: float
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._replica = replica
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._sync = client.register_script(_SYNC)

    def channel(self) -> str:
        """Return the channel a replica announces a changed head on."""
        return f"{self._prefix}:fair-heads"

    async def sync(self, entries: Sequence[ev.JournalEntry]) -> list[SyncResult]:
        """Flush ``entries`` and read the shared counters back, in one round trip."""
        if not entries:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for e in entries:
                base = f"{self._prefix}:fair:{e.model}:{e.tier}"
                args: list[str | int | float] = [self._replica, self._lease_ms]
                args.append("" if e.head is None else repr(e.head))
                args.append(len(e.journal.floors))
                for user, value in e.journal.floors.items():
                    args += [user, repr(value)]
                args.append(len(e.journal.deltas))
                for user, value in e.journal.deltas.items():
                    args += [user, repr(value)]
                args += e.active
                await self._sync(keys=[f"{base}:counters", f"{base}:heads"], args=args, client=pipe)
            rows = await pipe.execute()
        out = []
        for e, row in zip(entries, rows, strict=True):
            floor = float(row[0]) if row[0] else None
            counters = {u: float(v) for u, v in zip(e.active, row[1:], strict=True)}
            out.append(SyncResult(e.model, e.tier, counters, floor))
        return out
