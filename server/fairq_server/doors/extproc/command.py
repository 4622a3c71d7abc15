"""``fairq envoy bootstrap --config FILE``: print an Envoy bootstrap for this configuration."""

from __future__ import annotations

import argparse
import sys

from fairq_server.config.loader import load_config
from fairq_server.config.schema import Config, ConfigError
from fairq_server.doors.extproc.bootstrap import EnvoySetup, bootstrap, to_yaml

__all__ = ["main", "setup_of"]

#: Margin of Envoy's wait for fairq's answer over the queue's TTL.
_MARGIN_SECONDS = 5.0


def setup_of(config: Config) -> EnvoySetup:
    """Return the bootstrap's settings from ``config`` (``[envoy]``, ``[extproc]``).

    Raises:
        ConfigError: no ``extproc.listen`` and no ``envoy.replicas``, or a malformed replica.

    """
    replicas: list[tuple[str, str]] = []
    for i, entry in enumerate(config.envoy.replicas):
        name, sep, address = entry.partition("=")
        if not sep or not name or ":" not in address:
            raise ConfigError(f'envoy.replicas[{i}]: expected "name=host:port", not {entry!r}')
        replicas.append((name, address))
    if not replicas:
        if not config.extproc.listen:
            raise ConfigError("the bootstrap needs extproc.listen (or envoy.replicas)")
        host, _, port = config.extproc.listen.rpartition(":")
        if host in ("", "0.0.0.0", "[::]"):
            host = "127.0.0.1"
        replica = config.cluster.replica_id if config.cluster else "fairq"
        replicas.append((replica, f"{host}:{port}"))
    timeout = config.envoy.message_timeout_seconds
    if not timeout:
        ttl = config.scheduler.queue_ttl_seconds
        timeout = ttl + _MARGIN_SECONDS if ttl is not None else 300.0
    return EnvoySetup(
        listen=config.envoy.listen,
        extproc=replicas,
        message_timeout_seconds=timeout,
        admin_listen=config.envoy.admin_listen,
        connect_timeout_seconds=config.envoy.connect_timeout_seconds,
        read_usage=config.envoy.read_usage,
        max_body_bytes=config.limits.max_body_bytes,
    )


def main(argv: list[str]) -> int:
    """Run ``fairq envoy``."""
    parser = argparse.ArgumentParser(prog="fairq envoy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    boot = sub.add_parser("bootstrap", help="print an Envoy bootstrap (YAML) for --config")
    boot.add_argument("--config", required=True, help="fairq's TOML configuration file")
    args = parser.parse_args(argv)
    try:
        setup = setup_of(load_config(args.config))
    except (ConfigError, OSError) as exc:
        print(f"fairq envoy: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(bootstrap(setup)))
    return 0
