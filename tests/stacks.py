"""Where every task of the running loop is suspended: for a failure that is a hang."""

from __future__ import annotations

import asyncio
import sys
import traceback
from types import CoroutineType, FrameType
from typing import Any


def _chain(coro: Any) -> list[FrameType]:
    """The frames of ``coro`` and of every coroutine it awaits, outermost first."""
    frames: list[FrameType] = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            frames.append(frame)
        awaited = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        # An awaited future or task ends the chain (its own task is listed on its own).
        coro = (
            awaited if isinstance(awaited, CoroutineType) or hasattr(awaited, "ag_frame") else None
        )
    return frames


def task_stacks() -> str:
    """Every pending task of the running loop with its await chain, then every thread's stack.

    ``Task.get_stack`` shows only a suspended task's outermost frame; following ``cr_await``
    shows the line each coroutine in the chain waits on, which is what a hang needs.
    """
    out: list[str] = []
    for task in asyncio.all_tasks():
        frames = _chain(task.get_coro())
        lines = [f"  {f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in frames]
        out.append(f"task {task.get_name()}:\n" + "\n".join(lines))
    for ident, frame in sys._current_frames().items():
        out.append(f"thread {ident}:\n" + "".join(traceback.format_stack(frame)[-6:]))
    return "\n".join(out)
