"""Shared fairness counters: one hash of counters per model and tier, for every replica.

Each replica keeps its policies' counters locally (the dispatcher reads them on every pick)
and flushes what changed, in one round trip per sync for all its models and tiers: lifts as
"at least" (``max``), charges as ``HINCRBYFLOAT``. The same script returns the shared
counters of the replica's backlogged users and the other replicas' heads: each replica's two
smallest backlogged users (leased like a reservation, so a dead replica's heads expire). A
replica then serves a user only while its counter is within the slack of the smallest
counter of anyone else backlogged elsewhere, so the slots of the shared gate go to the user
furthest behind anywhere. The members of a group (a team's users) have heads of their own in
a second hash, per group, kept and leased the same way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from fairq_server.cluster.connection import ScriptCall, run_scripts
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.counters import JournaledCounters, PeerHeads
from fairq_server.scheduling.policies import Policies

__all__ = ["IDLE_SECONDS", "SharedCounters", "SyncResult", "shared_policies"]


def shared_policies(
    policies: Policies, slack: float, on_backlogged: Callable[[], None]
) -> Policies:
    """Return ``policies`` whose tiers keep their service counters shared with the cluster.

    Whatever the fairness policy, it is built on :class:`JournaledCounters`; ``slack`` is
    ``cluster.fairness_slack``, and ``on_backlogged`` is told when a user becomes backlogged
    (its head may be the new floor).
    """
    return dataclasses.replace(policies, counters=lambda: JournaledCounters(slack, on_backlogged))


# KEYS: counters hash, heads hash, last-seen sorted set, member heads hash. ARGV: replica,
# lease ms, heads (JSON, '' none), idle ms, member heads (JSON, '' none), n floors,
# (user, floor)*, n deltas, (user, delta)*, users to read*.
# Returns {n, heads*, m, member heads*, values*}: the heads of the *other* replicas (this
# replica knows its own), their member heads, then the users' counters. A replica's heads are
# stored as "<expiry ms> <JSON>", so a dead replica's expire. Every user written or read is
# stamped in the sorted set with Redis's time; the counters of users not seen for the idle
# time are deleted (at most _TRIM a sync, so one sync's script stays short; the next ones
# take the rest), so the hash holds the users of the last idle period, not everyone ever
# served.
_SYNC = """
local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[2])
local idle = tonumber(ARGV[4])
local function publish(key, value)
  if value == '' then
    redis.call('HDEL', key, ARGV[1])
  else
    redis.call('HSET', key, ARGV[1], (now + lease) .. ' ' .. value)
  end
  local others = {}
  local stored = redis.call('HGETALL', key)
  for j = 1, #stored, 2 do
    local expiry, v = string.match(stored[j + 1], '^(%S+) (.*)$')
    if expiry == nil or tonumber(expiry) <= now then
      redis.call('HDEL', key, stored[j])
    elseif stored[j] ~= ARGV[1] then
      others[#others + 1] = v
    end
  end
  redis.call('PEXPIRE', key, 2 * lease)
  return others
end
local i = 6
local n = tonumber(ARGV[i]) i = i + 1
for _ = 1, n do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if cur < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('ZADD', KEYS[3], now, ARGV[i])
  i = i + 2
end
n = tonumber(ARGV[i]) i = i + 1
for _ = 1, n do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[3], now, ARGV[i])
  i = i + 2
end
for j = i, #ARGV do redis.call('ZADD', KEYS[3], now, ARGV[j]) end
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - idle, 'LIMIT', 0, _TRIM)
if #gone > 0 then
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[3], unpack(gone))
end
local others = publish(KEYS[2], ARGV[3])
local members = publish(KEYS[4], ARGV[5])
redis.call('PEXPIRE', KEYS[1], idle)
redis.call('PEXPIRE', KEYS[3], idle)
local out = {#others}
for _, value in ipairs(others) do out[#out + 1] = value end
out[#out + 1] = #members
for _, value in ipairs(members) do out[#out + 1] = value end
for j = i, #ARGV do
  out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[j]) or '0'
end
return out
""".replace("_TRIM", "1000")

#: How long a user's shared counter outlives its last use: a user back after that starts at
#: the others' level, as a new one does, whatever it was served before (an hour held a user
#: who had run alone below its share for as long as it had run; issue 33).
IDLE_SECONDS = 60.0


@dataclass(frozen=True)
class SyncResult:
    """Shared counters of one tier's backlogged users here, and the other replicas' heads."""

    model: str
    tier: int
    counters: dict[str, float]
    heads: PeerHeads


class SharedCounters:
    """The Redis side of shared fairness (stateless).

    Args:
        client: the replica's Redis client.
        prefix: key prefix of this cluster.
        replica: this replica's id (names its head).
        lease_seconds: a head not refreshed for this long no longer holds others back.
        idle_seconds: a user's counter not written or read for this long is deleted (a
            returning user is lifted to the others' level again, as a new one is).

    """

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        lease_seconds: float,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._replica = replica
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._idle_ms = max(1, round(idle_seconds * 1000))
        self._sync = client.register_script(_SYNC)

    def channel(self) -> str:
        """Return the channel a replica announces a changed head on."""
        return f"{self._prefix}:fair-heads"

    async def sync(self, entries: Sequence[ev.JournalEntry]) -> list[SyncResult]:
        """Flush ``entries`` and read the shared counters back, in one round trip."""
        if not entries:
            return []
        calls: list[ScriptCall] = []
        for e in entries:
            base = f"{self._prefix}:fair:{e.model}:{e.tier}"
            args: list[str | int | float] = [self._replica, self._lease_ms]
            args.append(json.dumps(e.heads) if e.heads else "")
            args.append(self._idle_ms)
            args.append(json.dumps(e.members) if e.members else "")
            args.append(len(e.journal.floors))
            for user, value in e.journal.floors.items():
                args += [user, repr(value)]
            args.append(len(e.journal.deltas))
            for user, value in e.journal.deltas.items():
                args += [user, repr(value)]
            args += e.active
            keys = [
                f"{base}:counters",
                f"{base}:peer-heads",
                f"{base}:seen",
                f"{base}:peer-member-heads",
            ]
            calls.append((self._sync, keys, args))
        rows = await run_scripts(self._client, calls)
        out = []
        for e, row in zip(entries, rows, strict=True):
            n = int(row[0])
            m = int(row[1 + n])
            heads = PeerHeads(
                tuple((user, c) for (user,), c in _entries(row[1 : 1 + n], 1)),
                tuple((g, name, c) for (g, name), c in _entries(row[2 + n : 2 + n + m], 2)),
            )
            values = row[2 + n + m :]
            counters = {u: float(v) for u, v in zip(e.active, values, strict=True)}
            out.append(SyncResult(e.model, e.tier, counters, heads))
        return out


def _entries(stored: Sequence[bytes | str], names: int) -> Iterator[tuple[list[str], float]]:
    """Yield the ``(names, counter)`` entries other replicas stored (skip malformed).

    Each stored value is a JSON list of entries, each ``names`` strings and a number: heads
    ``[user, counter]``, member heads ``[group, name, counter]``. A value with a malformed
    entry is skipped from there on.
    """
    for value in stored:
        try:
            for *strings, counter in json.loads(value):
                if len(strings) != names:
                    raise ValueError(strings)
                named = all(isinstance(x, str) for x in strings)
                if named and isinstance(counter, int | float) and not isinstance(counter, bool):
                    yield strings, float(counter)
        except (ValueError, TypeError):
            continue
