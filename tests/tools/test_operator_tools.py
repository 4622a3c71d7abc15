"""fairq keys, health and top: the commands an operator runs, against real servers."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

import fairq
from fairq_server.config.loader import parse_config
from fairq_server.doors.tier import resolve_tier
from fairq_server.errors import PermissionDeniedError
from fairq_server.identity.auth import Authenticator
from fairq_server.tools import keys, top
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend


async def fairq_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairq_server", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_keys_new_prints_a_key_its_entry_admits(capsys: pytest.CaptureFixture[str]) -> None:
    assert keys.main(["new", "--user", 'o"hara', "--tiers", "batch", "--admin", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["key"].startswith("fq_") and len(made["key"]) > 40
    config = parse_config(tomllib.loads(made["toml"]))
    [entry] = config.keys
    assert (entry.user, entry.tiers, entry.admin) == ('o"hara', ("batch",), True)
    auth = Authenticator(config.keys, ("interactive", "standard", "batch"))
    principal = await auth.authenticate([("authorization", f"Bearer {made['key']}")])
    assert principal.user == 'o"hara' and principal.admin
    assert principal.tiers == frozenset({"batch"})


def test_keys_new_makes_a_different_key_each_time(capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):
        keys.main(["new", "--user", "u", "--json"])
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first["key"] != second["key"] and first["sha256"] != second["sha256"]
    assert "admin" not in first["toml"] and "tiers" not in first["toml"]


def test_keys_new_refuses_bad_input() -> None:
    with pytest.raises(SystemExit):
        keys.main(["new", "--user", ""])
    with pytest.raises(SystemExit):
        keys.main(["new", "--user", "u", "--weight", "0"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tiers", "interactive,premium"],
            "unknown tier 'premium': the default tiers are interactive, standard, batch",
        ),
        (["--max-tier", "gold"], "unknown tier 'gold'"),
        (["--max-tier", "batch", "--tiers", "batch"], "give --max-tier or --tiers, not both"),
    ],
)
def test_keys_new_refuses_tiers_the_server_would_refuse(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """An entry naming a tier the server does not have is refused when made, not at load."""
    with pytest.raises(SystemExit) as info:
        keys.main(["new", "--user", "u", *args])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "fq_" not in captured.out


def test_keys_new_checks_tiers_against_the_configuration_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fairq.toml"
    config.write_text('[[tiers]]\nname = "premium"\n[[tiers]]\nname = "free"\n')
    assert keys.main(["new", "--user", "u", "--max-tier", "premium", "--config", str(config),
                      "--json"]) == 0  # fmt: skip
    made = json.loads(capsys.readouterr().out)
    [entry] = parse_config(
        {**tomllib.loads(config.read_text()), **tomllib.loads(made["toml"])}
    ).keys
    assert entry.tiers == ("premium",)
    with pytest.raises(SystemExit):
        keys.main(["new", "--user", "u", "--max-tier", "interactive", "--config", str(config)])
    assert f"the tiers of {config} are premium, free" in capsys.readouterr().err


async def test_keys_new_max_tier_is_a_ceiling_every_lower_tier_may_be_used(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert keys.main(["new", "--user", "u", "--max-tier", "standard", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    config = parse_config(tomllib.loads(made["toml"]))
    tiers = ("interactive", "standard", "batch")
    principal = await Authenticator(config.keys, tiers).authenticate(
        [("authorization", f"Bearer {made['key']}")]
    )
    assert resolve_tier("", principal, tiers) == 1  # the default: its ceiling
    assert resolve_tier("batch", principal, tiers) == 2  # lower: allowed though not listed
    with pytest.raises(PermissionDeniedError):
        resolve_tier("interactive", principal, tiers)


async def test_keys_new_from_the_command_line_shows_the_key_and_the_entry() -> None:
    code, out, _ = await fairq_cli("keys", "new", "--user", "alice", "--group", "team-a")
    assert code == 0
    key = next(line.strip() for line in out.splitlines() if line.strip().startswith("fq_"))
    toml = out[out.index("[[keys]]") :]
    [entry] = parse_config(tomllib.loads(toml)).keys
    assert entry.group == "team-a"
    auth = Authenticator([entry], ("interactive",))
    assert (await auth.authenticate([("authorization", f"Bearer {key}")])).user == "alice"


async def test_health_exits_0_while_serving_and_1_when_gone(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    target = f"127.0.0.1:{server.port}"
    assert await fairq_cli("health", "--target", target) == (0, "SERVING\n", "")
    code, out, _ = await fairq_cli("health", "--target", target, "--service", "fairq.v1.Admin")
    assert (code, out) == (0, "SERVING\n")
    code, _, err = await fairq_cli("health", "--target", target, "--service", "nope")
    assert code == 1 and "NOT_FOUND" in err
    await server.stop(grace=0.1)
    code, _, err = await fairq_cli("health", "--target", target, "--timeout", "1")
    assert code == 1 and "UNAVAILABLE" in err


async def test_top_prints_a_frame_and_json_for_an_admin(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    target = f"127.0.0.1:{server.port}"
    async with fairq.AsyncClient(target, api_key="bob-key") as bob:
        await bob.complete("sim", "hi", max_tokens=4)
        await freeze_gate(server)
        streams = [bob.generate("sim", "hi", max_tokens=4, tier="batch") for _ in range(2)]
        for stream in streams:
            assert isinstance(await anext(stream), fairq.Queued)
        code, out, err = await fairq_cli("top", "--target", target, "--api-key", "root-key")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith(f"fairq top  {target}") and "queued 2" in lines[0]
        model_header = next(i for i, line in enumerate(lines) if line.startswith("MODEL"))
        assert lines[model_header].split() == [
            "MODEL", "QUEUED", "interactive", "standard", "batch", "USERS",
        ]  # fmt: skip
        assert lines[model_header + 1].split() == ["sim", "2", "0", "0", "2", "1"]
        bob_row = next(line for line in lines if line.startswith("bob"))
        assert bob_row.split()[1] == "2" and int(bob_row.split()[2]) > 0
        backend_row = next(line for line in lines if line.startswith("sim-a"))
        assert backend_row.split()[-3:] == ["stale", "stale", "stale"]

        code, out, _ = await fairq_cli(
            "top", "--target", target, "--json", "--users", "1"
        )  # no key: refused
        assert code == 1
        code, out, _ = await fairq_cli("top", "--target", target, "--json",
                                       "--api-key", "root-key")  # fmt: skip
        snap = json.loads(out)
        assert snap["models"][0]["queued"] == 2 and snap["users"][0]["user"] == "bob"
        for stream in streams:
            await stream.aclose()


def test_render_fits_the_width_and_handles_an_empty_server() -> None:
    empty = fairq.Snapshot(taken_at=0.0, models=(), users=(), backends=(), known_users=0)
    lines = top.render(empty, "h:1", width=40)
    assert "no models (no backend registered)" in lines and "no backends" in lines
    users = tuple(fairq.UserLoad(f"user-{i}-" + "x" * 40, i, 1e6) for i in range(3))
    snap = fairq.Snapshot(taken_at=0.0, models=(), users=users, backends=(), known_users=3)
    assert all(len(line) <= 30 for line in top.render(snap, "h:1", width=30))


_COMMANDS_HELP = [
    ("--help",), ("keys", "--help"), ("keys", "create", "--help"),
    ("keys", "create", "--file", "--help"), ("keys", "list", "--help"), ("teams", "--help"),
    ("limits", "--help"), ("audit", "--help"), ("usage", "--help"), ("db", "--help"),
    ("top", "--help"), ("health", "--help"), ("serve", "--help"), ("demo", "--help"),
    ("bench", "--help"),
]  # fmt: skip


@pytest.mark.parametrize("argv", _COMMANDS_HELP, ids=" ".join)
def test_help_texts_are_plain_words_for_operators(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from fairq_server.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(argv))
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: fairq")
    # No docstring markup, no design notes meant for the code's readers.
    for mark in ("``", ":mod:", ":class:", ":func:", "::", "library would", "Admin/Get"):
        assert mark not in text, (mark, text)


def test_keys_create_file_is_keys_new_with_the_same_options_as_a_stored_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fairq.toml"
    config.write_text('[[teams]]\nname = "red"\nweight = 2.0\n')
    argv = ["--user", "ann", "--team", "red", "--max-tier", "standard", "--json"]
    assert keys.main(["create", "--file", *argv, "--config", str(config)]) == 0
    made = json.loads(capsys.readouterr().out)
    [entry] = parse_config(tomllib.loads(made["toml"])).keys
    assert (entry.user, entry.team, entry.tiers) == ("ann", "red", ("standard",))
    assert keys.main(["new", *argv]) == 0  # the older spelling, kept for scripts
    assert parse_config(tomllib.loads(json.loads(capsys.readouterr().out)["toml"])).keys[0].team
    # A team the configuration does not have is refused now, not when the file is loaded.
    with pytest.raises(SystemExit):
        keys.main(["create", "--file", "--user", "ann", "--team", "blue", "--config", str(config)])
    assert "unknown team 'blue': the teams of" in capsys.readouterr().err
    # The same names on both kinds of key: --user, --team, --max-tier, --admin, --json.
    from fairq_server.tools.stored_keys import _parser

    stored = _parser().parse_args(
        ["create", "--user", "ann", "--team", "red", "--max-tier", "standard", "--admin",
         "--json", "--as-user", "ops"]
    )  # fmt: skip
    assert (stored.user, stored.team, stored.max_tier, stored.as_user) == (
        "ann", "red", "standard", "ops"
    )  # fmt: skip


def test_top_takes_as_user_like_every_tool_that_calls_fairq() -> None:
    from fairq_server.tools.admin_call import add_target_arguments

    parser = argparse.ArgumentParser()
    add_target_arguments(parser)
    assert parser.parse_args(["--as-user", "ops"]).as_user == "ops"
    assert top._parser().parse_args(["--as-user", "ops"]).as_user == "ops"
    assert top._parser().parse_args(["--user", "ops"]).as_user == "ops"  # the older spelling


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kind", "sgl"], "--kind 'sgl': expected one of vllm, tgi, openai"),
        (["--kind", "vllm", "--metrics-preset", "llamacpp"], "goes with --kind openai"),
    ],
)
def test_bench_kind_is_a_backend_kind(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fairq_bench.cli import main as bench

    with pytest.raises(SystemExit):
        bench(["flood", *argv])
    assert message in capsys.readouterr().err


async def test_the_example_client_without_a_key_says_so_in_one_line(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    example = Path(__file__).parents[2] / "examples" / "client.py"
    env = {k: v for k, v in os.environ.items() if k != "FAIRQ_API_KEY"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(example), f"127.0.0.1:{server.port}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "UNAUTHENTICATED" in lines[0] and "FAIRQ_API_KEY" in lines[0]


@pytest.mark.parametrize("service", ["", "fairq.v1.Scheduler", "é" * 200])
def test_health_encodes_its_messages_as_the_generated_classes_do(service: str) -> None:
    """fairq health skips protobuf's import (half its run time) by encoding two tiny messages."""
    from grpc_health.v1 import health_pb2

    from fairq_server.tools import health

    request = health_pb2.HealthCheckRequest(service=service)
    assert health.encode_request(service) == request.SerializeToString()
    for number, name in health.STATUSES.items():
        answer = health_pb2.HealthCheckResponse(status=number)  # type: ignore[arg-type]
        assert health.decode_status(answer.SerializeToString()) == name
        assert health_pb2.HealthCheckResponse.ServingStatus.Name(number) == name
    # Fields a later protocol version might add are skipped.
    assert health.decode_status(b"\x08\x01\x12\x03abc\x18\x05") == "SERVING"
    with pytest.raises(ValueError):
        health.decode_status(b"\x08")
