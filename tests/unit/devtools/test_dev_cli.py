"""``cursorsync-dev``, the development tools' command line (typer's CliRunner): the demo
and the benchmarks dispatch to their tools and print their figures; the simulator's
failover runs for real."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import cursorsync_devtools.cli as dev_cli
from cursorsync_devtools.sim import Workload, run_failover
from tests.support.processes import fake_module

pytestmark = pytest.mark.usefixtures("restore_logging")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(dev_cli.app, list(args))


# ------------------------------------------------------------------ help


def test_help_lists_the_demo_and_every_benchmark() -> None:
    out = invoke("--help")
    assert out.exit_code == 0
    for word in ("demo", "bench", "--log-level", "--log-json"):
        assert word in out.stdout
    bench = invoke("bench", "--help")
    assert bench.exit_code == 0
    for word in ("translate", "plan", "mapping-batch", "admin", "partitions", "mapping-rows",
                 "failover", "e2e", "layout", "soak", "read-path"):
        assert word in bench.stdout, word


@pytest.mark.parametrize(("command", "words"), [
    (["demo"], ["--json", "--seconds", "--work-dir", "--keep"]),
    (["bench", "translate"], ["--ranges", "--oracle-entries", "--json"]),
    (["bench", "failover"], ["--seed", "--partitions", "--messages", "--json"]),
    (["bench", "e2e"], ["--seconds", "--json"]),
    (["bench", "layout"], ["--rows", "--repeat", "--json"]),
    (["bench", "read-path"], ["--entries", "--repeat", "--json"]),
])
def test_command_help(command: list[str], words: list[str]) -> None:
    out = invoke(*command, "--help")
    assert out.exit_code == 0
    for word in words:
        assert word in out.stdout, word


# ------------------------------------------------------------------ demo, e2e


def test_demo_dispatches_and_prints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = fake_module(monkeypatch, "cursorsync_devtools.demo", "run_demo",
                        lambda **k: "DEMO TABLE")
    out = invoke("demo", "--seconds", "5", "--work-dir", str(tmp_path), "--keep", "--json",
                 "--evidence", "identity")
    assert out.exit_code == 0 and out.stdout == "DEMO TABLE\n"
    first = calls[0]
    assert first["spec"].produce_seconds == 5.0 and first["strategies"] == ["identity"]
    assert {k: first[k] for k in ("json_output", "work_dir", "keep")} == {
        "json_output": True, "work_dir": str(tmp_path), "keep": True}
    assert invoke("demo").exit_code == 0
    assert calls[1]["strategies"] == ["position-property", "identity"]
    assert calls[1]["work_dir"] is None and calls[1]["keep"] is False
    bad = invoke("demo", "--evidence", "telepathy")
    assert bad.exit_code == 2 and "telepathy" in bad.stderr


def test_bench_e2e_dispatches_and_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_module(monkeypatch, "cursorsync_devtools.bench_e2e", "run_e2e",
                        lambda **k: json.dumps({"losses": 0}))
    out = invoke("bench", "e2e", "--json", "--seconds", "7")
    assert out.exit_code == 0 and json.loads(out.stdout) == {"losses": 0}
    assert calls == [{"args": (), "seconds": 7.0, "json_output": True, "backlog": 200_000,
                      "strategies": ("position-property", "identity"), "identity_scope": "all"}]
    out = invoke("bench", "e2e", "--backlog", "5000", "--evidence", "position-property")
    assert out.exit_code == 0
    assert calls[1]["backlog"] == 5000 and calls[1]["strategies"] == ("position-property",)
    out = invoke("bench", "e2e", "--evidence", "snapshot")
    assert out.exit_code == 0 and calls[2]["strategies"] == ("snapshot",)
    out = invoke("bench", "e2e", "--evidence", "snapshots")
    assert out.exit_code != 0 and "snapshots" in out.output


# ------------------------------------------------------------------ bench


def test_bench_translate_json() -> None:
    out = invoke("bench", "translate", "--ranges", "20000", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert {"ranges", "entries", "segments", "seconds", "peak_memory_mb", "oracle_seconds",
            "speedup_on_subset", "oracle_agrees_on_subset"} <= set(data)
    assert data["ranges"] == 20000 and data["oracle_agrees_on_subset"] is True


def test_bench_translate_table() -> None:
    out = invoke("bench", "translate", "--ranges", "500", "--oracle-entries", "1000")
    assert out.exit_code == 0
    rows = dict(line.split(None, 1) for line in out.stdout.splitlines()[1:])
    assert rows["ranges"].strip() == "500" and rows["oracle_agrees_on_subset"].strip() == "yes"


def test_bench_failover_json_shows_no_losses() -> None:
    out = invoke("bench", "failover", "--json", "--messages", "3000", "--seed", "3")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["cursorsync"]["losses"] == 0
    assert data["cursorsync"]["duplicates"] < data["builtin"]["duplicates"]
    assert data["workload"]["seed"] == 3 and data["workload"]["messages"] == 3000


def test_bench_failover_table() -> None:
    out = invoke("bench", "failover", "--messages", "2000", "--partitions", "2")
    assert out.exit_code == 0
    lines = out.stdout.splitlines()
    assert "CURSORSYNC" in lines[2] and "BUILT-IN" in lines[2]
    losses = next(line for line in lines if line.startswith("losses"))
    assert losses.split()[1] == "0"
    assert any(line.startswith("duplicates") for line in lines)


def test_bench_failover_exits_1_on_losses(monkeypatch: pytest.MonkeyPatch) -> None:
    real = run_failover(Workload(messages=500))
    lossy = replace(real, cursorsync=replace(real.cursorsync, losses=3))
    monkeypatch.setattr("cursorsync_devtools.sim.run_failover", lambda w: lossy)
    out = invoke("bench", "failover", "--messages", "500")
    assert out.exit_code == 1 and "cursorsync lost 3 messages" in out.stderr


def test_bench_failover_bad_workload_is_a_user_error() -> None:
    out = invoke("bench", "failover", "--partitions", "4", "--messages", "2")
    assert out.exit_code == 2 and out.stderr.startswith("error: invalid Workload: messages=2")


def test_bench_partitions_and_mapping_rows_dispatch_and_print(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_module(monkeypatch, "cursorsync_devtools.bench_partitions", "bench_partitions",
                        lambda *a, **k: {"partitions": a[0], "runs": {
                            m: {"losses": 0} for m in k["holes"]}})
    out = invoke("bench", "partitions", "--partitions", "1000", "--seconds", "20",
                 "--timeout", "1800", "--json")
    assert out.exit_code == 0 and json.loads(out.stdout) == {
        "partitions": 1000, "runs": {"verified": {"losses": 0}, "probe": {"losses": 0}}}
    assert calls == [{"args": (1000,), "entries_per_partition": 20, "produce_seconds": 20.0,
                      "timeout_s": 1800.0, "holes": ("verified", "probe"),
                      "batch_index_acks": False, "cursor_digests": False,
                      "kept_readers": False, "memory_scale": None, "warm_up": False,
                      "work_dir": None, "digests_only": False, "watch_builtin": False}]
    calls.clear()
    invoke("bench", "partitions", "--holes", "probe", "--kept-readers", "--warm-up", "--json")
    assert calls[0]["kept_readers"] is True and calls[0]["holes"] == ("probe",)
    assert calls[0]["warm_up"] is True
    calls.clear()
    invoke("bench", "partitions", "--holes", "probe", "--digests-only", "--watch-builtin",
           "--json")
    assert calls[0]["digests_only"] is True and calls[0]["watch_builtin"] is True
    calls.clear()
    fake_module(monkeypatch, "cursorsync_devtools.bench_partitions", "bench_partitions",
                lambda *a, **k: {"partitions": a[0], "runs": {
                    m: {"losses": 0, "cpu_s": {"broker b": 12.5}} for m in k["holes"]}})
    out = invoke("bench", "partitions", "--holes", "probe")
    assert out.exit_code == 0 and "probe losses" in out.stdout
    assert "probe cpu_s broker b" in out.stdout and "12.5" in out.stdout
    assert invoke("bench", "partitions", "--holes", "maybe").exit_code == 2
    batch = fake_module(monkeypatch, "cursorsync_devtools.bench_mapping_batch",
                        "bench_mapping_batch", lambda *a, **k: {
                            "partitions": a[0], "batches": [{"state_seconds": 0.1}]})
    out = invoke("bench", "mapping-batch", "--partitions", "500", "--active", "0.5")
    assert out.exit_code == 0 and "steady batch: state_seconds" in out.stdout
    assert batch == [{"args": (500,), "active": 0.5}]
    rows = fake_module(monkeypatch, "cursorsync_devtools.bench", "bench_mapping_rows",
                       lambda *a, **k: {"rows_per_entry_after_merge": 2e-05})
    out = invoke("bench", "mapping-rows", "--entries", "5000")
    assert out.exit_code == 0 and "rows_per_entry_after_merge" in out.stdout
    assert rows == [{"args": (5000,), "batch_entries": 500}]
