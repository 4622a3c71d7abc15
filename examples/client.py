"""Stream one request through fairq: ``python examples/client.py [TARGET] [MODEL]``.

With ``FAIRQ_API_KEY`` set the key is sent; otherwise (a fairq without keys) the user is
named by ``x-fairq-user``.
"""

from __future__ import annotations

import asyncio
import os
import sys

import fairq


async def main(target: str, model: str) -> None:
    """Send "Hello" to ``model`` at ``target`` and print the streamed text."""
    api_key = os.environ.get("FAIRQ_API_KEY")
    user = None if api_key else "readme"
    async with fairq.AsyncClient(target, api_key=api_key, user=user) as client:
        async for event in client.generate(model, "Hello", max_tokens=32, tier="interactive"):
            if isinstance(event, fairq.Chunk):
                print(event.text, end="", flush=True)
            elif isinstance(event, fairq.Finished):
                print(f"\n[{event.finish_reason}: {event.completion_tokens} tokens, "
                      f"TTFT {event.ttft_seconds * 1000:.0f} ms]")  # fmt: skip
            else:
                print(f"[{type(event).__name__.lower()}]", file=sys.stderr)


if __name__ == "__main__":
    args = sys.argv[1:]
    target = args[0] if args else "127.0.0.1:50051"
    try:
        asyncio.run(main(target, args[1] if len(args) > 1 else "sim"))
    except fairq.FairqError as exc:
        # fairq's answer in one line (a missing key, an unknown model, no backend up).
        hint = " (set FAIRQ_API_KEY to your key)" if exc.code.name == "UNAUTHENTICATED" else ""
        sys.exit(f"{sys.argv[0]}: {target}: {exc}{hint}")
