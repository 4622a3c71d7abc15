"""The operator's web console under ``/console`` on the HTTP door (``docs/design/console.md``)."""

from __future__ import annotations

from fairq_server.console.entitlement_forms import EntitlementForms
from fairq_server.console.feed import LiveFeed
from fairq_server.console.manage import ManageRoutes
from fairq_server.console.routes import ConsoleRoutes
from fairq_server.core import FairqCore
from fairq_server.identity.auth import Authenticator
from fairq_server.observe.entitled import EntitledWindow
from fairq_server.observe.history import LiveHistory
from fairq_server.observe.live import LiveView, read_live
from fairq_server.observe.recent import RecentService
from fairq_server.observe.replicas import ReplicaViews
from fairq_server.store.service import Store
from fairq_server.tenancy.managed import ManagedEntitlement

__all__ = ["ConsoleRoutes", "build_console"]


def build_console(
    core: FairqCore,
    auth: Authenticator,
    recent: RecentService,
    store: Store | None = None,
    managed: ManagedEntitlement | None = None,
) -> ConsoleRoutes:
    """Return the console over ``core`` (its settings are read from ``core.config.console``).

    Args:
        core: the scheduling core (queues, backends; in a cluster, its Redis connection).
        auth: the authenticator both doors share.
        recent: the recent service per user (the figures ``GetQueueSnapshot`` shows).
        store: fairq's store (keys and usage views), if it has one.
        managed: team weights, quotas and budgets set live (with a store).

    """
    window = EntitledWindow(recent.tau)  # one per process: every page reads the same window

    def read() -> LiveView:
        settings = core.config.console
        return read_live(
            core,
            recent,
            replica=here,
            starved_after=settings.starved_after_seconds,
            max_users=settings.max_users,
            window=window,
        )

    here, replicas = "", None
    if core.cluster is not None:
        here = core.cluster.replica_id
        ttl = round(3 * core.config.console.refresh_seconds) + 1
        replicas = ReplicaViews(core.cluster.client, core.cluster.config.key_prefix, here, ttl)
    history = LiveHistory(core, recent, core.config.console.history_points)

    def history_every() -> float:
        history.resize(core.config.console.history_points)  # a reload may change it
        return core.config.console.history_seconds

    feed = LiveFeed(
        read, lambda: core.config.console.refresh_seconds, replicas, here, history, history_every
    )
    manage = ManageRoutes(store, lambda: core.config.keys) if store is not None else None
    forms = EntitlementForms(managed) if managed is not None else None
    return ConsoleRoutes(
        auth,
        feed,
        core.config.console.session_seconds,
        manage,
        forms,
        allowed_hosts=lambda: core.config.console.allowed_hosts,
        trusted_proxies=lambda: core.config.http.trusted_proxies,
    )
