"""Sizes of a load run (full and quick) and the constants both phases share."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ADMISSION_WINDOW", "FULL", "MODEL", "PROFILE", "QUICK", "SHORT_TOKENS", "LoadSize"]

MODEL = "sim"
PROFILE = "llama-8b-gpu"
SHORT_TOKENS = 8
# gRPC core rejects (CANCELLED) new calls at random once more than ~1000 wait for the
# application to accept them ("grpc.server.max_pending_requests", hard limit 3000), and
# fairq keeps the defaults. The load generator therefore ramps up: at most this many calls
# are sent and not yet answered at any time. `burst()` measures the unpaced case.
ADMISSION_WINDOW = 500


@dataclass(frozen=True)
class LoadSize:
    """Sizes of a run.

    Attributes:
        streams: requests running at once on the backend (fairq's ``max_in_flight`` for it).
        queued: requests waiting in fairq's queue behind them.
        users: distinct users sending them.
        hold_seconds: how long the running streams last (covers filling the queue).
        speed: the simulator's clock factor (lower = fewer tokens per second to relay).
        soak_seconds: length of the soak, in rounds of ``round_seconds``.
        round_seconds: one round of soak traffic and one fault.
        soak_rate: soak arrivals per second.
        soak_speed: the soak's simulators' clock factor.
        churn_users: after the soak, this many requests each from a new user (0: skip).
        channels: client channels (TCP connections) to fairq.
        hold_while_filling: hold the simulator's engine (SIGUSR1) from when every stream has
            its first token until fairq reports the whole queue, then release it (SIGUSR2):
            the queue fills however slow the machine, but no token is relayed meanwhile.
            Off, the streams must outlast the fill (``hold_seconds``).

    """

    streams: int = 2_000
    queued: int = 20_000
    users: int = 1_000
    hold_seconds: float = 150.0
    speed: float = 0.25
    soak_seconds: float = 180.0
    round_seconds: float = 15.0
    soak_rate: float = 40.0
    soak_speed: float = 1.0
    churn_users: int = 20_000
    channels: int = 16
    hold_while_filling: bool = False


FULL = LoadSize()
QUICK = LoadSize(
    streams=200,
    queued=2_000,
    users=100,
    hold_seconds=12.0,
    soak_seconds=30.0,
    round_seconds=10.0,
    soak_rate=25.0,
    churn_users=2_000,
    channels=4,
)
