"""What an operator sees: the live queues and backends read from the core, below both doors.

:mod:`.live` reads one replica's queues and backends into plain values; :mod:`.replicas`
publishes each replica's view to Redis and reads every replica's back, so the console shows
the whole cluster. The console (:mod:`fairq_server.console`) renders them.
"""
