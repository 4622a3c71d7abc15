"""Scale-out benchmarks: 1, 2, 4 replicas on one simulated backend, with and without Redis.

``python -m fairq_bench.cluster table|fairness|cost|faults|demo`` (see ``--help``).
"""
