"""The configuration's one owner at run time: the dispatcher applies a reload, then the core
follows; a refused reload changes nothing anywhere."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from fairq_server.config.schema import AdminConfig, Config, ConfigError
from fairq_server.scheduling.routing import PrefixAffinityRouter
from fairq_sim import SimServer
from tests.conftest import FairqFactory, make_config, sim_backend


async def test_a_reload_is_applied_by_the_dispatcher_and_read_from_it(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)])
    core = (await fairq_factory(config)).core
    new = replace(
        config, scheduler=replace(config.scheduler, fairness="vtc", routing_options={"slack": 4})
    )
    await core.reconfigure(new)
    settings = core.dispatcher.settings
    assert settings.config is new.scheduler and settings.tiers == new.tiers
    assert core.config is new
    assert core.policies is settings.policies  # no second copy of the plugins
    assert isinstance(core.policies.router, PrefixAffinityRouter)
    assert core.policies.router.slack == 4


def bad_routing_value(config: Config, sim: SimServer) -> Config:
    return replace(config, scheduler=replace(config.scheduler, routing_options={"slack": -1}))


def unknown_gate_option(config: Config, sim: SimServer) -> Config:
    return replace(config, scheduler=replace(config.scheduler, gate_options={"bogus": 1}))


def over_the_backend_limit(config: Config, sim: SimServer) -> Config:
    backends = (sim_backend(sim), sim_backend(sim, "sim-b"))
    return replace(config, admin=AdminConfig(max_backends=1), backends=backends)


@pytest.mark.parametrize("spoil", [bad_routing_value, unknown_gate_option, over_the_backend_limit])
async def test_a_refused_reload_changes_nothing(
    sim: SimServer, fairq_factory: FairqFactory, spoil: Callable[[Config, SimServer], Config]
) -> None:
    config = make_config([sim_backend(sim)])
    core = (await fairq_factory(config)).core
    before = core.dispatcher.settings
    changed = replace(config.scheduler, fairness="vtc", poll_interval_seconds=9.0)
    with pytest.raises(ConfigError):
        await core.reconfigure(spoil(replace(config, scheduler=changed), sim))
    assert core.dispatcher.settings is before
    assert core.config is config
    assert [b.id for b in core.backends()] == ["sim-a"]


async def test_a_reload_the_dispatcher_fails_to_apply_is_not_the_cores_either(
    sim: SimServer, fairq_factory: FairqFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault while the loop applies it (here: rebuilding the queues) leaves the old
    settings in the dispatcher and the old configuration in the core, and is reported."""
    config = make_config([sim_backend(sim)])
    core = (await fairq_factory(config)).core
    before = core.dispatcher.settings

    def broken(new_queue: object) -> None:
        raise RuntimeError("rebuild failed")

    monkeypatch.setattr(core.dispatcher._models, "rebuild", broken)
    new = replace(config, scheduler=replace(config.scheduler, fairness="vtc"))
    with pytest.raises(RuntimeError, match="rebuild failed"):
        await core.reconfigure(new)
    assert core.dispatcher.settings is before
    assert core.config is config
