"""Request handling both doors share: checks, the ticket's life, the request log.

Below the gRPC door (:mod:`fairq_server.api`) and the HTTP door (:mod:`fairq_server.http`),
above scheduling: neither door imports the other, both import this.
"""
