"""The ``svattn`` CLI and the demo, end to end on the shipped MIMIC-III slice."""

from __future__ import annotations

import argparse
import doctest
import io
import json
import sys

import pytest

from svattn import cli, demo
from svattn.cli import Command, build_parser, main
from svattn.demo import run_demo


def test_cli_demo_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    verdict = lines[-1]
    assert verdict.startswith("verdict  VERIFIED: stay ")
    assert "certificates valid" in verdict and "partition equal" in verdict
    assert "all ok" in out  # every certificate checked right after its deletion
    assert any(line.strip().startswith("VERIFIED: digest ok") for line in lines)
    assert "576 hourly tokens" in out  # the first 6 stays of the slice
    assert "KKT residual" in out and "partition: margin" in out


def test_run_demo_deletes_every_token_of_the_stay() -> None:
    buffer = io.StringIO()
    result = run_demo(stays=5, delete=204201, show=3, out=buffer)
    assert result.ok and result.final.ok and result.final.partition_equal
    assert result.deleted_stay == 204201 and result.deleted_subject > 0
    assert len(result.certificates) == 17  # the stay's 17 observed hours
    assert all(check.ok for check in result.checks)
    assert result.final.max_alpha_dev < 1e-9 and result.final.readout_dev < 1e-8
    removed = [c.removed_id for c in result.certificates]
    assert len(set(removed)) == len(removed)
    assert "17 certificates in" in buffer.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--stays", "99"], "stays: asked for 99 stays"),
        (["demo", "--delete", "5"], "delete: stay 5 is not among the 6 streamed stays"),
        (["demo", "--data", "/no/such/file.csv.gz"], "path '/no/such/file.csv.gz' does not exist"),
    ],
    ids=["too-many-stays", "unknown-stay", "missing-data"],
)
def test_cli_reports_user_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("svattn demo: error: ") and message in err


def test_cli_rejects_bad_numbers_and_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--C", "0"])
    assert exc.value.code == 2
    assert "--C: must be a number > 0" in capsys.readouterr().err
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_adding_a_subcommand_is_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--n", type=int, default=1)

    seen: list[int] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args.n)
        return 0

    echo = Command("echo", "test", add_arguments, run)
    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, echo])
    assert main(["echo", "--n", "7"]) == 0 and seen == [7]
    assert "echo" in build_parser().format_help()


@pytest.mark.parametrize("module", [cli, demo], ids=["cli", "demo"])
def test_docstring_examples_run(module) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted >= 1


def test_demo_out_round_trip_to_the_auditor_commands(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--stays", "2", "--show", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    certs = sorted((out / "certificates").glob("[0-9]*.json"))
    assert len(certs) > 1 and (out / "certificates" / "last.json").read_text() == \
        certs[-1].read_text()
    state, log = out / "state.safetensors", out / "audit.jsonl"
    last = out / "certificates" / "last.json"
    assert f"svattn verify-deletion {state} {last} --log {log}" in printed
    # signed with the run's key, which no auditor holds: the log's checkpoints unchecked
    assert main(["verify-deletion", str(state), str(last), "--log", str(log)]) == 3
    captured = capsys.readouterr()
    assert "audit log records it" in captured.out and "optimality proven" in captured.out
    assert "audit log UNCHECKED: the signature of audit.jsonl.checkpoint" in captured.out
    # the log's checkpoints are signed with the run's key, which no auditor holds: exit 3
    assert main(["audit", "verify", str(log), str(state)]) == 3
    report = capsys.readouterr().out
    assert f"{len(certs)} deletion certificates consistent" in report
    assert "UNCHECKED: the signature of audit.jsonl.checkpoint" in report
    # an earlier certificate is not what the final state answers for
    assert main(["verify-deletion", str(state), str(certs[0])]) == 1
    # the folder is never overwritten
    assert main(["demo", "--stays", "2", "--show", "0", "--out", str(out)]) == 2
    assert "already holds" in capsys.readouterr().err


def test_signed_demo_reaches_a_signed_verified_deletion(tmp_path, capsys) -> None:
    """The README's auditor path, signed end to end: keygen, demo --signing-key,
    verify-deletion --public-key; another key's public half fails."""
    assert main(["keygen", str(tmp_path / "controller")]) == 0
    assert main(["keygen", str(tmp_path / "other")]) == 0
    out = tmp_path / "demo"
    assert main(["demo", "--stays", "2", "--show", "0", "--out", str(out), "--signing-key",
                 str(tmp_path / "controller.key")]) == 0
    assert "--public-key" in capsys.readouterr().out
    state, log = out / "state.safetensors", out / "audit.jsonl"
    last = out / "certificates" / "last.json"
    assert json.loads(last.read_text())["signature"]
    argv = ["verify-deletion", str(state), str(last), "--log", str(log), "--public-key"]
    assert main([*argv, str(tmp_path / "controller.pub")]) == 0
    assert "signature ok" in capsys.readouterr().out
    assert main([*argv, str(tmp_path / "other.pub")]) == 1
    assert main(["demo", "--stays", "2", "--out", str(tmp_path / "d2"), "--signing-key",
                 str(tmp_path / "absent.key")]) == 2
    assert "--signing-key" in capsys.readouterr().err


def test_a_cold_numba_cache_is_announced(tmp_path, monkeypatch, capsys) -> None:
    empty = tmp_path / "compiled"
    (empty / "__pycache__").mkdir(parents=True)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.delenv("NUMBA_DISABLE_JIT", raising=False)
    assert cli._numba_cache_is_cold(empty)
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    (empty / "__pycache__" / f"checks.kkt_pass-24.{tag}.nbi").write_bytes(b"")
    assert not cli._numba_cache_is_cold(empty)
    # main says so before a command that runs the exact core, and not before one that does not
    monkeypatch.setattr(cli, "_numba_cache_is_cold", lambda: True)
    assert main(["audit", "verify", str(tmp_path / "none.jsonl")]) == 2
    assert "compiling the exact core's numba kernels" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "none.pt")]) == 2
    assert "compiling" not in capsys.readouterr().err
