"""Limit books: the counters of what each team and user was granted, per window.

:mod:`.book` is the interface; :mod:`.local` keeps the counters in this process,
:mod:`.redis` in Redis for a cluster, :mod:`.cluster` decides on the slot claim's round trip,
:mod:`.persisted` keeps calendar counters across restarts.
"""
