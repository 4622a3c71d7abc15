"""Closed-loop callers: fair shares at any concurrency (``fairq bench closed-loop``)."""
