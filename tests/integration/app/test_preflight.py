"""The preflight (`cursorsync check`, and `cursorsync run` before Spark) on the real test bed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cursorsync.app import cli
from cursorsync.app.preflight import Finding, check, problems
from cursorsync.app.settings import Config, parse_config
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.standalone import free_port

pytestmark = pytest.mark.integration

SUB = "orders-app"


@pytest.fixture
def good(testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> Config:
    topic = testbed.topic(topic_name())
    testbed.create_topic(topic)
    testbed.client("a").subscribe(topic, SUB).close()
    return demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])


def changed(config: Config, change: Callable[[dict], None]) -> Config:  # type: ignore[type-arg]
    data = config.model_dump(mode="json", by_alias=True)
    change(data)
    return parse_config(data)


def lines(found: list[Finding]) -> list[str]:
    return [f.line() for f in found]


def test_a_good_config_is_all_ok(good: Config) -> None:
    t0 = time.monotonic()
    found = check(good)
    print(f"preflight: {len(found)} checks in {time.monotonic() - t0:.2f} s")
    assert not problems(found), lines(found)
    whats = " | ".join(lines(found))
    for part in ("source cluster a admin API", "target cluster b admin API",
                 "source cluster a broker", "target cluster b broker",
                 "single-entry reads on the target", "tables path"):
        assert part in whats, whats
    # b's subscription does not exist yet: the job makes it, which is fine.
    assert f"the job creates {SUB} at the earliest entry" in whats


def test_an_unreachable_admin_api_and_broker_are_one_line_each(good: Config) -> None:
    port = free_port()
    bad = changed(good, lambda d: d["clusters"]["target"].update(
        admin_url=f"http://127.0.0.1:{port}", service_url=f"pulsar://127.0.0.1:{port}"))
    found = problems(check(bad))
    assert len(found) == 1, lines(found)
    assert found[0].what == f"target cluster b admin API http://127.0.0.1:{port}"
    assert "unreachable" in found[0].detail
    no_broker = changed(good, lambda d: d["clusters"]["source"].update(
        service_url=f"pulsar://127.0.0.1:{port}"))
    (broker,) = problems(check(no_broker))
    assert broker.what == f"source cluster a broker pulsar://127.0.0.1:{port}", broker
    assert broker.detail == f"connection refused by 127.0.0.1:{port}", broker


def test_a_missing_topic_and_source_subscription_are_named(
        good: Config, testbed: TestBed) -> None:
    topic = good.topics[0].topic
    missing_topic = topic + "-absent"
    bad = changed(good, lambda d: d["topics"].append(
        {"topic": missing_topic, "subscriptions": [SUB]}))
    found = lines(problems(check(bad)))
    assert f"problem  topic {missing_topic} on the source cluster a: not found" in found, found
    assert f"problem  topic {missing_topic} on the target cluster b: not found" in found, found
    no_sub = changed(good, lambda d: d["topics"][0].update(subscriptions=[SUB, "nobody"]))
    (sub,) = problems(check(no_sub))
    assert sub.what == f"subscription nobody of {topic} on the source cluster a", sub


def test_an_unwritable_tables_path_is_a_problem(good: Config, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = changed(good, lambda d: d["tables"].update(path=str(blocker / "tables")))
    (found,) = problems(check(bad))
    assert found.what == f"tables path {blocker / 'tables'}" and "not writable" in found.detail


def test_check_and_run_from_the_command_line(good: Config, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(good.model_dump(mode="json", by_alias=True)))
    out = runner.invoke(cli.app, ["check", "-c", str(ok)])
    assert out.exit_code == 0, out.output
    assert "ok       tables path" in out.stdout
    port = free_port()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(changed(good, lambda d: d["clusters"]["source"].update(
        admin_url=f"http://127.0.0.1:{port}")).model_dump(mode="json", by_alias=True)))
    out = runner.invoke(cli.app, ["check", "-c", str(bad)])
    assert out.exit_code == 2
    assert f"problem  source cluster a admin API http://127.0.0.1:{port}" in out.stdout
    assert out.stderr == "error: the preflight found 1 problem(s)\n"
    # `run` stops at the same problem before Spark starts.
    t0 = time.monotonic()
    out = runner.invoke(cli.app, ["run", "-c", str(bad)])
    assert out.exit_code == 2 and "nothing was started" in out.stderr, out.output
    assert "pyspark" not in out.stderr
    print(f"run refused in {time.monotonic() - t0:.2f} s")

