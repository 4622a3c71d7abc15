"""The README's first client: stream one answer from model "sim" with the key in FAIRQ_API_KEY.

Run from a checkout: ``FAIRQ_API_KEY=fq_... uv run python examples/hello.py``.
"""

import asyncio
import os

import fairq


async def main() -> None:
    """Stream one answer from model "sim" and print each event."""
    api_key = os.environ.get("FAIRQ_API_KEY")  # none: fine for a fairq in open mode
    async with fairq.AsyncClient("127.0.0.1:50051", api_key=api_key) as client:
        async for event in client.generate("sim", "Hello", max_tokens=32, tier="interactive"):
            print(event)


try:
    asyncio.run(main())
except fairq.FairqError as exc:  # a missing key, an unknown model: one line, no traceback
    raise SystemExit(f"hello.py: {exc}") from None
