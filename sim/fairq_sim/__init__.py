"""A simulated continuous-batching inference backend (vLLM- and TGI-compatible HTTP).

The simulator imitates an engine closely enough that fairq, the official clients and the
benchmarks cannot tell the difference where it matters: continuous batching with a slot
limit, step times from a calibrated model, a paged KV cache with prefix caching, FCFS or
priority queueing with preemption, aborts on disconnect, and each backend's HTTP API and
Prometheus metrics. See ``profiles`` for the step-time model and its calibration.

Public API::

    SimConfig                      what to simulate (mode, model, profile, capacity, faults)
    create_app(config)             the Starlette app
    SimServer(config)              async context manager on 127.0.0.1:0, ``.url``
    ThreadedSimServer(config)      the same in a background thread, for synchronous code
    Engine, EngineConfig, ...      the pure engine, for offline runs with a ManualClock
    cli.main(argv)                 ``fairq sim ...``
"""

from fairq_sim.app import create_app, sim_state
from fairq_sim.clock import ManualClock
from fairq_sim.config import SimConfig, SimMode
from fairq_sim.engine import Engine, EngineConfig
from fairq_sim.events import EngineObserver, StepPlan, TokenOutput
from fairq_sim.profiles import PROFILES, Measurements, Profile, calibrate, get_profile
from fairq_sim.request import FinishReason, RequestStatus, SimRequest
from fairq_sim.server import SimServer, ThreadedSimServer
from fairq_sim.state import SimState

__all__ = [
    "PROFILES",
    "Engine",
    "EngineConfig",
    "EngineObserver",
    "FinishReason",
    "ManualClock",
    "Measurements",
    "Profile",
    "RequestStatus",
    "SimConfig",
    "SimMode",
    "SimRequest",
    "SimServer",
    "SimState",
    "StepPlan",
    "ThreadedSimServer",
    "TokenOutput",
    "calibrate",
    "create_app",
    "get_profile",
    "sim_state",
]
