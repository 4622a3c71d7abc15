"""The doors callers come in by, and what they share: checks, the ticket's life, the request log.

:mod:`.grpc` (``fairq.v1``) and :mod:`.http` (OpenAI-compatible) sit above scheduling and
beside each other: neither door imports the other; both import the modules here.
"""
