"""The store's tables, in SQLAlchemy Core: one description for SQLite and PostgreSQL.

The migrations (``migrations/versions``) create exactly these; a test compares them.

- ``usage``: one row per finished, failed or cancelled request (the usage ledger). ``id`` is
  made by fairq when the request ends, so a batch retried after a lost acknowledgement is not
  written twice (inserts skip an id already there).
- ``api_keys``: keys made with ``fairq keys create``, stored as SHA-256 digests.
- ``audit_log``: who (the admin's identity) did what through the console or the Admin API,
  and when; kept for ``store.audit_retention_days`` and at most ``store.audit_max_rows`` rows.
- ``store_versions``: one counter per kind of shared state, raised in the same transaction as
  every key change, so a replica learns of a change by reading one small row.
- ``limit_usage``: what each quota and budget counter of a calendar window (day, month) used
  per period, so a restart does not give a day's budget back. ``key_id`` is a digest of the
  counter's fields (a bounded primary key); the fields are stored verbatim beside it.

- ``teams``: team weights set over the Admin API or the console (``entitlement_version``).
- ``entitlement_limits``: quotas and budgets set the same way, one row per kind (``quota`` or
  ``budget``), subject (``team`` or ``user`` and its name) and model (``""``: every model).
  Either table's rows override the configuration file's entry of the same subject
  (:mod:`fairq_server.tenancy.managed`); the ``tenancy`` counter of ``store_versions``
  is raised with every change.

``team`` is nullable in ``usage`` and ``api_keys``: a user without a team is its own team.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Double,
    Index,
    MetaData,
    String,
    Table,
    Text,
)

__all__ = [
    "ENTITLEMENT_VERSION",
    "KEYS_VERSION",
    "api_keys",
    "audit_log",
    "entitlement_limits",
    "limit_usage",
    "metadata",
    "store_versions",
    "teams",
    "usage",
]

KEYS_VERSION = "keys"
ENTITLEMENT_VERSION = "entitlement"

# Explicit constraint names: migrations that alter these tables later can refer to them on
# every engine.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

usage = Table(
    "usage",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("ended_at", DateTime(timezone=True), nullable=False),
    Column("request_id", Text, nullable=False),
    Column("user_name", Text, nullable=False),
    Column("team", Text, nullable=True),
    Column("model", Text, nullable=False),
    Column("backend", Text, nullable=False),
    Column("tier", Text, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost", Double, nullable=True),
    Column("queue_seconds", Double, nullable=True),
    Column("ttft_seconds", Double, nullable=True),
    Column("outcome", String(64), nullable=False),
    Column("replica", Text, nullable=False),
    Index("ix_usage_ended_at", "ended_at"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("sha256", String(64), nullable=False, unique=True),
    Column("user_name", Text, nullable=False),
    Column("team", Text, nullable=True),
    Column("tiers", JSON, nullable=False),
    Column("admin", Boolean, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Column("replaces", String(32), nullable=True),
    # When a replica last authenticated a request with it (written in batches, not per
    # request: up to a minute behind; store/keys.py).
    Column("last_used_at", DateTime(timezone=True), nullable=True),
)

store_versions = Table(
    "store_versions",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("version", BigInteger, nullable=False),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", Text, nullable=False),
    Column("via", String(32), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("replica", Text, nullable=False),
    Index("ix_audit_log_at", "at"),
)

limit_usage = Table(
    "limit_usage",
    metadata,
    Column("key_id", String(64), primary_key=True),
    Column("period", String(16), primary_key=True),
    Column("scope", String(16), nullable=False),
    Column("subject", Text, nullable=False),
    Column("model", Text, nullable=True),
    Column("measure", String(16), nullable=False),
    Column("limit_window", String(16), nullable=False),
    Column("amount", Double, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_limit_usage_period", "period"),
)

teams = Table(
    "teams",
    metadata,
    Column("name", String(256), primary_key=True),
    Column("weight", Double, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

entitlement_limits = Table(
    "entitlement_limits",
    metadata,
    Column("kind", String(8), primary_key=True),
    Column("scope", String(8), primary_key=True),
    Column("subject", String(256), primary_key=True),
    Column("model", String(256), primary_key=True),
    Column("tokens_per_minute", BigInteger, nullable=True),
    Column("tokens_per_day", BigInteger, nullable=True),
    Column("requests_per_minute", BigInteger, nullable=True),
    Column("per_day", Double, nullable=True),
    Column("per_month", Double, nullable=True),
    Column("mode", String(8), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
