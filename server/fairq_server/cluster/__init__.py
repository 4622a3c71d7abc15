"""Scale-out: several fairq replicas sharing one gate, one registry and one fairness on Redis.

Nothing here is imported unless the configuration has a ``[cluster]`` section.
"""
