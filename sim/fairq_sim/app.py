"""The Starlette application of a simulated backend, and the faults around it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fairq_sim.config import SimConfig
from fairq_sim.state import SimState
from fairq_sim.tgi_api import tgi_routes
from fairq_sim.vllm_api import vllm_routes
from fairq_sim.vllm_metrics import VllmMetrics

__all__ = ["create_app", "sim_state"]

_HEALTH_PATHS = frozenset({"/health", "/ping"})


def create_app(config: SimConfig) -> Starlette:
    """Build the ASGI app of one simulated backend.

    The engine loop starts with the app's lifespan, so serve it with a server that runs
    lifespan events (uvicorn does by default). ``app.state.sim`` is the :class:`SimState`.

    Args:
        config: What to simulate; validated here.

    Returns:
        The Starlette application.

    Raises:
        ValueError: If ``config`` is invalid.

    """
    state = SimState(config)
    openai = config.mode in ("vllm", "sglang")
    routes = vllm_routes() if openai else tgi_routes()
    routes.append(Route("/metrics", _metrics, methods=["GET"]))
    if config.mode == "vllm":
        # vLLM mounts prometheus_client's app at /metrics/, which renders only the samples
        # asked for by name[] (fairq asks so; its /metrics route renders everything).
        routes.append(Route("/metrics/", _metrics_by_name, methods=["GET"]))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.startup()
        try:
            yield
        finally:
            await state.shutdown()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(_WarmupMiddleware, state=state)],
        exception_handlers={
            404: _not_found if openai else _empty_error,
            405: _not_allowed if openai else _empty_error,
        },
    )
    app.state.sim = state
    return app


def sim_state(app: Starlette) -> SimState:
    """Return the :class:`SimState` of an app made by :func:`create_app`."""
    state: SimState = app.state.sim
    return state


# vLLM is a FastAPI app (JSON "detail" bodies); TGI's axum router answers with empty bodies.
async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": "Not Found"}, status_code=404)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)


async def _empty_error(request: Request, exc: Exception) -> Response:
    return Response(status_code=getattr(exc, "status_code", 404))


async def _metrics(request: Request) -> Response:
    state: SimState = request.app.state.sim
    return await _exposition(state, state.metrics.render)


async def _metrics_by_name(request: Request) -> Response:
    state: SimState = request.app.state.sim
    metrics = state.metrics
    assert isinstance(metrics, VllmMetrics)  # the route exists in vLLM mode only
    names = request.query_params.getlist("name[]")
    return await _exposition(state, lambda: metrics.render(names))


async def _exposition(state: SimState, render: Callable[[], bytes]) -> Response:
    if state.config.metrics_delay > 0:
        # A simulated slow exporter, not a synchronisation wait.
        await asyncio.sleep(state.config.metrics_delay)
    if state.config.metrics_fail:
        return PlainTextResponse("Internal Server Error", status_code=500)
    return Response(render(), headers={"content-type": state.metrics.content_type})


class _WarmupMiddleware:
    """Answers 503 until the slow-start fault's delay has passed (health checks included)."""

    def __init__(self, app: ASGIApp, state: SimState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.state.ready() or scope["path"] in _HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        response: Response
        if self.state.config.mode != "tgi":
            error = {
                "message": "The server is starting up.",
                "type": "Service Unavailable",
                "param": None,
                "code": 503,
            }
            response = JSONResponse({"error": error}, status_code=503)
        else:
            body = {"error": "Model is loading", "error_type": "unavailable"}
            response = JSONResponse(body, status_code=503)
        await response(scope, receive, send)
