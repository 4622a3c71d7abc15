"""The gRPC door: ``fairq.v1.Scheduler``, ``fairq.v1.Admin``, health and reflection."""
