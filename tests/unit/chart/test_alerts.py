"""The chart's alerts and dashboard: promtool check and unit tests (alerts/), every
metric they name exposed by the job, every alert with its runbook."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cursorsync.app.metrics import Metrics
from cursorsync.core.records import PartitionKey
from tests.support import helm_tools as ht

UNIT_TESTS = Path(__file__).parent / "alerts" / "cursorsync-rules.test.yaml"
DASHBOARD = ht.CHART / "dashboards" / "cursorsync.json"
ALERTS = {
    "CursorSyncLagHigh", "CursorSyncStale", "CursorSyncUnmappedGrowing",
    "CursorSyncHoleChecksBehind",
    "CursorSyncGuardRefusals", "CursorSyncHalted", "CursorSyncEmissionErrors",
    "CursorSyncQueryFailures", "CursorSyncRestarts", "CursorSyncDown", "CursorSyncDryRun",
    "CursorSyncDriverRestarts", "CursorSyncMetricsMissing", "CursorSyncTableMaintenanceOverdue",
}
#: Labels Prometheus adds to every scraped series (the ServiceMonitor's target labels),
#: and a histogram bucket's bound.
TARGET_LABELS = {"namespace", "job", "instance", "pod", "service", "container", "endpoint"}


#: The values the promtool unit tests' rules are rendered with: the chart's defaults, with a
#: config that names subscriptions settlement and fraud-scoring (and "*" on a namespace).
RULE_VALUES: dict[str, Any] = {
    "prometheusRule.enabled": True,
    "config.topics": [{"topic": "persistent://payments/geo/orders",
                       "subscriptions": ["settlement", "fraud-scoring"]}],
    "config.namespaces": [{"namespace": "payments/geo", "subscriptions": ["*", "settlement"]}],
}


@pytest.fixture(scope="module")
def default_rules() -> list[dict[str, Any]]:
    return ht.render(set_values=RULE_VALUES)


def write_rules(manifests: list[dict[str, Any]], directory: Path) -> Path:
    """The PrometheusRule's spec as a Prometheus rules file."""
    path = directory / "cursorsync-rules.yaml"
    path.write_text(yaml.safe_dump(ht.prometheus_rules(manifests), sort_keys=False),
                    encoding="utf-8")
    return path


def run_promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ht.promtool(), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


# --------------------------------------------------------------------------- promtool


@pytest.mark.parametrize("case", ["default", "full"])
def test_promtool_checks_the_rendered_rules(case: str, tmp_path: Path) -> None:
    manifests = (ht.render([ht.FULL_VALUES]) if case == "full"
                 else ht.render(set_values={"prometheusRule.enabled": True}))
    rules = write_rules(manifests, tmp_path)
    result = run_promtool("check", "rules", rules, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ht.alerts(manifests))} rules found" in result.stdout
    assert {a["alert"] for a in ht.alerts(manifests)} == ALERTS


def test_promtool_unit_tests_pass(default_rules: list[dict[str, Any]], tmp_path: Path) -> None:
    write_rules(default_rules, tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test(
        default_rules: list[dict[str, Any]]) -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))["tests"]
             for case in test.get("alert_rule_test", [])]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = {a["alert"] for a in ht.alerts(default_rules)}
    assert names == ALERTS
    assert fires == names and quiet == names
    # A firing case states the alert's labels and every annotation, runbook included.
    for case in cases:
        for expected in case.get("exp_alerts") or []:
            assert "severity" in expected["exp_labels"], case["alertname"]
            assert set(expected["exp_annotations"]) == {"summary", "description",
                                                        "runbook_url"}, case["alertname"]


# --------------------------------------------------------------------------- suspended

_TARGET = 'namespace="cursorsync", job="cursorsync-metrics", instance="10.0.0.5:9108"'
#: A job that runs for ten minutes and then is stopped (a suspension deletes the driver
#: pod): its target goes, and Prometheus marks every series of it stale.
STOPPED_JOB: list[dict[str, str]] = [
    {"series": f"up{{{_TARGET}}}", "values": "1x10 stale"},
    {"series": f'cursorsync_build_info{{{_TARGET}, version="0.1.0"}}', "values": "1x10 stale"},
    *({"series": f'cursorsync_last_successful_sync_timestamp_seconds{{{_TARGET}, '
                 f'subscription="{sub}"}}', "values": "0+60x10 stale"}
      for sub in ("settlement", "fraud-scoring")),
    {"series": f"cursorsync_process_start_time_seconds{{{_TARGET}}}", "values": "0x10 stale"},
    {"series": f"cursorsync_dry_run{{{_TARGET}}}", "values": "0x10 stale"},
    {"series": f'cursorsync_query_batch_id{{{_TARGET}, query="cursorsync-sync"}}',
     "values": "0+1x10 stale"},
]


def promtool_test(manifests: list[dict[str, Any]], cases: list[dict[str, Any]],
                  directory: Path) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of the rendered rules on STOPPED_JOB, with these cases."""
    write_rules(manifests, directory)
    tests = {"rule_files": ["cursorsync-rules.yaml"], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": STOPPED_JOB,
                        "alert_rule_test": cases}]}
    (directory / "stopped.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False),
                                                 encoding="utf-8")
    return run_promtool("test", "rules", "stopped.test.yaml", cwd=directory)


def test_a_suspended_job_fires_no_alert(tmp_path: Path) -> None:
    """Suspended, the rules leave CursorSyncDown out, and none of the others fires on a job
    that is not running; running, the same stop fires CursorSyncDown."""
    suspended = ht.render(set_values={**RULE_VALUES, "suspend": True})
    names = {a["alert"] for a in ht.alerts(suspended)}
    assert names == ALERTS - {"CursorSyncDown"}
    quiet = [{"alertname": name, "eval_time": at, "exp_alerts": []}
             for name in sorted(names) for at in ("5m", "20m", "2h")]
    result = promtool_test(suspended, quiet, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

    running = ht.render(set_values=RULE_VALUES)
    (down,) = [a for a in ht.alerts(running) if a["alert"] == "CursorSyncDown"]
    annotations = {k: v.replace("{{ $labels.namespace }}/{{ $labels.job }}",
                                "cursorsync/cursorsync-metrics")
                   for k, v in down["annotations"].items()}
    fires = [{"alertname": "CursorSyncDown", "eval_time": "20m", "exp_alerts": [
        {"exp_labels": {"severity": "critical", "namespace": "cursorsync",
                        "job": "cursorsync-metrics"},
         "exp_annotations": annotations}]}]
    result = promtool_test(running, fires, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- values


def test_thresholds_severities_and_selection_come_from_values() -> None:
    manifests = ht.render(set_values={
        "prometheusRule.enabled": True,
        "alerts.lagHigh": {"p99Seconds": 42, "window": "7m", "for": "3m", "severity": "info"},
        "alerts.disabled": ["CursorSyncDown", "CursorSyncRestarts"],
        "prometheusRule.additionalAlertLabels": {"team": "payments"},
    })
    rules = {a["alert"]: a for a in ht.alerts(manifests)}
    assert set(rules) == ALERTS - {"CursorSyncDown", "CursorSyncRestarts"}
    lag = rules["CursorSyncLagHigh"]
    assert lag["expr"].endswith("> 42") and "[7m]" in lag["expr"] and lag["for"] == "3m"
    assert lag["labels"] == {"severity": "info", "team": "payments"}


def _halted_rules(manifests: list[dict[str, Any]]) -> dict[str, str]:
    """CursorSyncHalted's rules: severity -> the cause matcher of its expression."""
    out = {}
    for rule in ht.alerts(manifests):
        if rule["alert"] == "CursorSyncHalted":
            found = re.search(r'cause(=~|!~)"([^"]*)"', rule["expr"])
            out[rule["labels"]["severity"]] = "".join(found.groups()) if found else ""
    return out


def test_halt_severities_come_from_the_cause() -> None:
    """A rule per severity: the causes values.yaml lists at theirs, any other cause (unknown)
    at alerts.halted.severity."""
    default = ht.render(set_values={"prometheusRule.enabled": True})
    assert _halted_rules(default) == {"critical": "!~first_sync|target_reset",
                                      "warning": "=~first_sync|target_reset"}
    moved = ht.render(set_values={"prometheusRule.enabled": True, "alerts.halted": {
        "severity": "warning", "causes": {"target_reset": "info"}}})
    assert _halted_rules(moved) == {
        "warning": "!~source_rewind|target_reset|topic_recreated",
        "critical": "=~source_rewind|topic_recreated", "info": "=~target_reset"}
    same = ht.render(set_values={"prometheusRule.enabled": True, "alerts.halted.causes": {
        "target_reset": "critical", "first_sync": "critical"}})
    assert _halted_rules(same) == {"critical": ""}


def test_maintenance_overdue_follows_the_configs_interval() -> None:
    def expr(**values: Any) -> str:
        manifests = ht.render(set_values={"prometheusRule.enabled": True, **values})
        (rule,) = [a for a in ht.alerts(manifests)
                   if a["alert"] == "CursorSyncTableMaintenanceOverdue"]
        return str(rule["expr"])

    default = expr()
    assert default.count("> 10800 and") == 5 and "[7200s]" in default
    assert set(re.findall(r'table="(\w+)"', default)) == {
        "mappings", "builtin_updates", "mapping_waits", "cursor_states", "sync_progress"}
    shorter = expr(**{"config.tables.maintenance_interval_s": 600,
                      "alerts.maintenanceOverdue.intervals": 4})
    assert shorter.count("> 2400 and") == 5 and "[1800s]" in shorter


def test_missing_series_are_those_of_the_configs_subscriptions(
        default_rules: list[dict[str, Any]]) -> None:
    (rule,) = [a for a in ht.alerts(default_rules) if a["alert"] == "CursorSyncMetricsMissing"]
    named = re.findall(r'"subscription", "([^"]*)", "", ""', rule["expr"])
    assert named == ["fraud-scoring", "settlement"]  # once each, "*" left out
    assert "cursorsync_build_info" in rule["expr"]


def test_every_alert_links_its_runbook(default_rules: list[dict[str, Any]]) -> None:
    base = yaml.safe_load((ht.CHART / "values.yaml").read_text(encoding="utf-8"))[
        "alerts"]["runbookBaseUrl"]
    assert base.rstrip("/").endswith("docs/runbooks")
    for alert in ht.alerts(default_rules):
        name = alert["alert"]
        assert alert["annotations"]["runbook_url"] == f"{base.rstrip('/')}/{name}.md"
        runbook = ht.RUNBOOKS / f"{name}.md"
        assert runbook.is_file(), f"{name} has no runbook at {runbook}"
        text = runbook.read_text(encoding="utf-8")
        assert text.startswith(f"# {name}\n"), f"{runbook} does not start with # {name}"
        for section in ("## Meaning", "## Diagnosis", "## Mitigation"):
            assert section in text, f"{runbook} has no {section}"


def test_every_runbook_belongs_to_an_alert() -> None:
    assert {p.stem for p in ht.RUNBOOKS.glob("*.md")} - {"README"} == ALERTS


# --------------------------------------------------------------------------- metric names


def exercised_metrics() -> Metrics:
    """A Metrics with every metric given a sample, so the exposition shows its labels."""
    m = Metrics(subscriptions_of=lambda topic: ("settlement",))
    m.record_entries_ingested("source", 1)
    m.set_skipped_waiting({PartitionKey("persistent://t/n/topic", 0): 1})
    m.set_dry_run(True)
    m.set_failover_ready("settlement", True)
    m.record_segments_written(1)
    m.record_skipped_ids(claimed=1, unclaimed=1)
    m.observe_sync_lag("settlement", 1.0)
    m.record_acks("settlement", "individual", 1)
    m.record_outcome("settlement", "emitted")
    m.set_unmapped_acked("settlement", "persistent://t/n/topic#0", 1)
    m.record_rewound("settlement", 1)
    m.set_halted({("settlement", "source_rewind"): 1})
    m.set_redelivery_forecast("settlement", "acked_unmapped", {"persistent://t/n/topic#0": 1})
    m.observe_translation(0.001)
    m.observe_batch("sync", 1.0)
    m.observe_batch_phases("sync", {"step": 0.5})
    m.observe_batch_phases("mapping", {"build": 0.5}, cpu={"build": 0.25})
    m.mark_synced("settlement")
    m.record_error("emit")
    m.record_maintenance("mappings", 1)
    m.record_skipped_id_requests("cursor-read", 1)
    m.record_source_lookups("tail-check", 1)
    m.record_target_cursor_reads("plugin", 1)
    m.observe_progress({"name": "cursorsync-sync", "numInputRows": 1, "inputRowsPerSecond": 1,
                        "processedRowsPerSecond": 1, "batchId": 1,
                        "durationMs": {"addBatch": 1}})
    return m


def exposed() -> tuple[dict[str, set[str]], dict[str, str]]:
    """Every sample name the job exposes with its label names, and each family's help."""
    samples: dict[str, set[str]] = {}
    helps: dict[str, str] = {}
    families = list(text_string_to_metric_families(exercised_metrics().exposition()))
    for family in families:
        helps[family.name] = family.documentation
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    # Every family of a fresh registry has samples here: a new metric must be exercised too.
    fresh = {f.name for f in Metrics().registry.collect()}
    assert fresh <= {f.name for f in families if f.samples}, "exercise the new metrics above"
    return samples, helps


def promql_references(expr: str) -> Iterable[tuple[str, set[str], dict[str, str]]]:
    """(metric, label names matched, label=value equalities) of each cursorsync selector."""
    for match in re.finditer(r"\b(cursorsync_[a-zA-Z0-9_]+)(?:\{([^}]*)\})?", expr):
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', match.group(2) or "")
        yield (match.group(1), {name for name, _, _ in matchers},
               {name: value for name, op, value in matchers if op == "="})


def expressions(default_rules: list[dict[str, Any]]) -> dict[str, str]:
    exprs = {a["alert"]: a["expr"] for a in ht.alerts(default_rules)}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            exprs[f"dashboard {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs[f"dashboard variable {variable['name']}"] = variable["definition"]
    return exprs


def reference_problems(exprs: dict[str, str], samples: dict[str, set[str]]) -> list[str]:
    """What each expression names that the job does not expose: metrics, label matchers,
    grouping labels, label_values() labels."""
    problems = []
    for where, expr in exprs.items():
        used: set[str] = set()
        for metric, labels, _ in promql_references(expr):
            if metric not in samples:
                problems.append(f"{where}: {metric} is not exposed")
                continue
            used |= samples[metric]
            unknown = labels - samples[metric] - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: {metric} has no label {sorted(unknown)}")
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
            unknown = {g.strip() for g in grouping.split(",")} - used - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: grouped by {sorted(unknown)}, which no metric has")
        for variable in re.findall(r"label_values\([^,]*,\s*(\w+)\)", expr):
            if variable not in used | TARGET_LABELS:
                problems.append(f"{where}: label_values of unknown label {variable}")
    return problems


def test_alerts_and_dashboard_name_only_exposed_metrics_and_labels(
        default_rules: list[dict[str, Any]]) -> None:
    samples, _ = exposed()
    assert reference_problems(expressions(default_rules), samples) == []


def test_the_cross_check_sees_a_wrong_name_or_label() -> None:
    samples, _ = exposed()
    problems = reference_problems({
        "metric": "rate(cursorsync_sync_lag_second_bucket[5m])",
        "label": 'cursorsync_errors_total{stage="emit", subscription="s"}',
        "grouping": "sum by (topic) (cursorsync_acks_sent_total)",
        "fine": 'sum by (kind) (rate(cursorsync_acks_sent_total{job="j"}[5m]))',
    }, samples)
    assert [p.split(":")[0] for p in problems] == ["metric", "label", "grouping"]


def test_label_values_the_alerts_match_are_ones_the_job_records(
        default_rules: list[dict[str, Any]]) -> None:
    _, helps = exposed()
    source = "\n".join(p.read_text(encoding="utf-8")
                       for p in (ht.ROOT / "streaming" / "cursorsync").rglob("*.py"))
    recorded_stages = set(re.findall(r'record_error\("([a-z_]+)"[,)]', source))
    # The outcomes are named in the counter's help text.
    outcomes = set(re.findall(r"[a-z_]+", helps["cursorsync_sync_outcomes"].split(":", 1)[1]))
    for where, expr in expressions(default_rules).items():
        for metric, _, equal in promql_references(expr):
            if "stage" in equal:
                assert equal["stage"] in recorded_stages, f"{where}: stage {equal['stage']}"
            if metric == "cursorsync_sync_outcomes_total" and "result" in equal:
                assert equal["result"] in outcomes, f"{where}: result {equal['result']}"


def test_the_dashboard_shows_what_operators_look_at() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    shown = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("cursorsync_sync_lag_seconds_bucket", "cursorsync_sync_outcomes_total",
                   "cursorsync_acks_sent_total", "cursorsync_unmapped_acked_entries",
                   "cursorsync_last_successful_sync_timestamp_seconds",
                   "cursorsync_batch_duration_seconds_bucket",
                   "cursorsync_mapping_entries_ingested_total", "cursorsync_errors_total",
                   "cursorsync_query_input_rows_per_second", "cursorsync_halted_partitions"):
        assert metric in shown, metric
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
