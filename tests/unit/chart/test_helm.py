"""The Helm chart, with the real tools: helm lint and template, the Kubernetes schemas,
the spark-operator's and prometheus-operator's CRDs (see helm_tools)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import yaml

from cursorsync.app.settings import Config
from cursorsync.app.settings.loading import load_config_text
from tests.support import helm_tools as ht

VALUES_CASES = {"default": [], "full": [ht.FULL_VALUES]}
PYPROJECT = tomllib.loads((ht.ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def pinned(package: str) -> str:
    """The version pyproject.toml pins a dependency to."""
    spec: str = next(d for d in PYPROJECT["project"]["dependencies"]
                     if d.startswith(f"{package}=="))
    return spec.split("==")[1]


@pytest.fixture(scope="module", params=sorted(VALUES_CASES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, ht.render(VALUES_CASES[request.param])


@pytest.fixture(scope="module")
def full() -> list[dict[str, Any]]:
    return ht.render([ht.FULL_VALUES])


# --------------------------------------------------------------------------- lint, render


@pytest.mark.parametrize("case", sorted(VALUES_CASES))
def test_helm_lint_strict_passes(case: str) -> None:
    report = ht.lint(VALUES_CASES[case])
    # Severity 1 is informational ("icon is recommended"); warnings fail under --strict.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_default_values_render_the_job_its_state_claim_and_its_service_only(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    case, manifests = rendered
    kinds = sorted(m["kind"] for m in manifests)
    if case == "default":
        assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Service", "SparkApplication"]
    else:  # an existing claim
        assert kinds == ["ConfigMap", "ConfigMap", "PrometheusRule", "Role", "RoleBinding",
                         "Service", "ServiceAccount", "ServiceMonitor", "SparkApplication"]


def test_monitoring_resources_need_the_prometheus_operator_api() -> None:
    without = ht.render([ht.FULL_VALUES], api_versions=())
    assert not ht.of_kind(without, "ServiceMonitor") and not ht.of_kind(without, "PrometheusRule")
    text = ht.notes([ht.FULL_VALUES], api_versions=())
    assert "no prometheus-operator CRDs" in text and "alerts were not created" in text
    only_rules = ht.render([ht.FULL_VALUES], api_versions=[ht.MONITORING_APIS[1]])
    assert [m["kind"] for m in only_rules if m["apiVersion"].startswith("monitoring")] == [
        "PrometheusRule"]


# --------------------------------------------------------------------------- schemas


def test_every_manifest_is_valid_for_its_schema(rendered: tuple[str, list[dict[str, Any]]]
                                                ) -> None:
    _, manifests = rendered
    for manifest in manifests:
        ht.validate_manifest(manifest)


BREAKAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "misspelled driver field": lambda a: a["spec"]["driver"].update(coreLimits="1"),
    "misspelled spec field": lambda a: a["spec"].update(sparkConfs={"a": "b"}),
    "instances as a word": lambda a: a["spec"]["executor"].update(instances="two"),
    "unknown restart policy": lambda a: a["spec"]["restartPolicy"].update(type="Sometimes"),
    "misspelled volume source": lambda a: a["spec"]["volumes"][0].update(
        configMapp=a["spec"]["volumes"][0].pop("configMap")),
    "sparkConf value not a string": lambda a: a["spec"]["sparkConf"].update(x=1),
    "label value not a string": lambda a: a["metadata"]["labels"].update(x=1),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_spark_application_fails_the_crd(full: list[dict[str, Any]], breakage: str
                                                  ) -> None:
    app = copy.deepcopy(ht.spark_application(full))
    BREAKAGES[breakage](app)
    with pytest.raises(jsonschema.ValidationError):
        ht.validate_manifest(app)


def test_broken_core_and_monitoring_manifests_fail(full: list[dict[str, Any]]) -> None:
    service = copy.deepcopy(ht.of_kind(full, "Service")[0])
    service["spec"]["ports"][0]["prot"] = 9108
    monitor = copy.deepcopy(ht.of_kind(full, "ServiceMonitor")[0])
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    rule = copy.deepcopy(ht.of_kind(full, "PrometheusRule")[0])
    rule["spec"]["groups"][0]["rules"][0]["fore"] = "5m"
    for broken in (service, monitor, rule):
        with pytest.raises(jsonschema.ValidationError):
            ht.validate_manifest(broken)


BAD_VALUES: dict[str, dict[str, Any]] = {
    "top-level typo": {"executors": {"instances": 2}},
    "nested typo": {"driver.memroy": "2g"},
    "cursorsync config typo": {"config.emission.spread_accross_executors": True},
    "unknown config section": {"config.metric": {"port": 9108}},
    "instances as a string": {"executor.instances": "2"},
    "memory without a unit pattern": {"driver.memory": "two gigabytes"},
    "unknown emission mode": {"config.emission.mode": "bulk"},
    "unknown severity": {"alerts.stale.severity": "page"},
    "bad duration": {"alerts.down.for": "5 minutes"},
    "unknown alert disabled": {"alerts.disabled": ["CursorSyncLagHgh"]},
    "metrics off": {"config.metrics.port": 0},
    # spark-submit's master (the operator's) decides where the job runs.
    "spark.master set": {"config.spark.master": "local[2]"},
    "claim size without a quantity": {"persistence.size": "ten gigabytes"},
    "unknown access mode": {"persistence.accessModes": ["ReadWriteAll"]},
    "no access mode": {"persistence.accessModes": []},
    "negative grace period": {"driver.terminationGracePeriodSeconds": -1},
    "extra mount without a path": {"extraVolumeMounts": [{"name": "cache"}]},
    "extra volume without a name": {"extraVolumes": [{"emptyDir": {}}]},
    "scratch size without a quantity": {"scratch.sizeLimit": "big"},
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_fail_the_values_schema(case: str) -> None:
    h = ht.helm()
    with pytest.raises(h.HelmValuesError, match="schema"):
        ht.render(set_values=BAD_VALUES[case])
    assert ht.lint(set_values=BAD_VALUES[case])["errors"], "helm lint accepted it"


TEMPLATE_CHECKS: dict[str, tuple[dict[str, Any], str]] = {
    "state on the pod's disk": ({"config.spark.checkpoint_dir": "/tmp/checkpoints"},
                                'config.spark.checkpoint_dir is "/tmp/checkpoints", a local '
                                "path that no volume holds"),
    "state beside the volume": ({"persistence.claimName": "c",
                                 "config.tables.path": "file:///data/tables"},
                                'config.tables.path is "file:///data/tables", a local path '
                                "that no volume holds"),
    "state without the volume": ({"persistence.enabled": False},
                                 "a local path that no volume holds"),
    "secret over the config": ({"secrets.tls.secretName": "tls",
                                "secrets.tls.mountPath": "/etc/cursorsync/tls"},
                               "inside /etc/cursorsync"),
    "extra mount over the config": ({"extraVolumes": [{"name": "x", "emptyDir": {}}],
                                     "extraVolumeMounts": [{"name": "x",
                                                            "mountPath": "/etc/cursorsync/x"}]},
                                    "mount path /etc/cursorsync/x is inside /etc/cursorsync"),
    "extra volume named as the chart's": ({"extraVolumes": [{"name": "tmp", "emptyDir": {}}]},
                                          "extraVolumes: the name tmp is one the chart gives "
                                          "its own volumes"),
    "checkpoints on s3a": ({"config.spark.checkpoint_dir": "s3a://bucket/checkpoints"},
                           'config.spark.checkpoint_dir is "s3a://bucket/checkpoints", not a '
                           "local path: the job keeps its mapping builder's state and the "
                           "cursor polls it replays there as files, beside Spark's "
                           "checkpoints. Use a path under persistence.mountPath "
                           "(/var/lib/cursorsync); object storage is for config.tables.path"),
    # Refused with or without requireDurableState: the job refuses it too.
    "checkpoints on gs, no durability check": (
        {"config.spark.checkpoint_dir": "gs://bucket/checkpoints",
         "validation.requireDurableState": False},
        'config.spark.checkpoint_dir is "gs://bucket/checkpoints", not a local path'),
    "delta-spark tables on the volume, executors without it": (
        {"config.tables.backend": "delta-spark"},
        'config.tables.path "/var/lib/cursorsync/tables" is on the state volume and the '
        "backend is delta-spark, whose executors write the table files: set "
        "persistence.executors true (with a ReadWriteMany claim), or use backend delta-rs"),
    "executors on a ReadWriteOnce claim": (
        {"persistence.executors": True},
        "persistence.executors mounts the state volume on every executor, on other nodes than "
        "the driver: persistence.accessModes (ReadWriteOnce) must include ReadWriteMany"),
}


@pytest.mark.parametrize("case", sorted(TEMPLATE_CHECKS))
def test_values_the_schema_cannot_judge_fail_rendering(case: str) -> None:
    values, message = TEMPLATE_CHECKS[case]
    h = ht.helm()
    with pytest.raises(h.HelmRenderError, match=re.escape(message)):
        ht.render(set_values=values)


def _mounts(app: dict[str, Any], role: str) -> dict[str, str]:
    """mount path -> volume name, of the driver's or the executors' container."""
    return {m["mountPath"]: m["name"] for m in app["spec"][role]["volumeMounts"]}


def _volumes(app: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in app["spec"]["volumes"]}


def test_the_defaults_keep_the_state_on_a_claim_the_chart_creates_and_keeps() -> None:
    """The shipped values run on a cluster with a default StorageClass: the checkpoints and
    the delta-rs tables on a claim of the release's, which `helm uninstall` leaves."""
    manifests = ht.render()
    (claim,) = ht.of_kind(manifests, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "cursorsync-state"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    # No storageClassName: the cluster's default class ("" would mean none).
    assert "storageClassName" not in claim["spec"]
    app = ht.spark_application(manifests)
    assert _volumes(app)["state"]["persistentVolumeClaim"] == {"claimName": "cursorsync-state"}
    assert _mounts(app, "driver")["/var/lib/cursorsync"] == "state"
    assert "state" not in _mounts(app, "executor").values()
    config = load_config_text(ht.config_text(manifests), source="default ConfigMap")
    assert config.tables.backend == "delta-rs"
    assert config.tables.path.startswith("/var/lib/cursorsync/")
    assert config.spark.checkpoint_dir.startswith("/var/lib/cursorsync/")
    for manifest in manifests:
        ht.validate_manifest(manifest)
    assert "PersistentVolumeClaim cursorsync-state" in ht.notes()


def test_the_claim_takes_a_storage_class_and_an_existing_claim_replaces_it() -> None:
    classed = ht.render(set_values={"persistence.storageClassName": "fast-ssd",
                                    "persistence.size": "50Gi"})
    (claim,) = ht.of_kind(classed, "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    existing = ht.render(set_values={
        "persistence.claimName": "state",
        "config.spark.checkpoint_dir": "file:///var/lib/cursorsync/checkpoints",
        "config.tables.path": "file://localhost/var/lib/cursorsync/tables"})
    assert not ht.of_kind(existing, "PersistentVolumeClaim")
    volumes = ht.spark_application(existing)["spec"]["volumes"]
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "state"}} in volumes


@pytest.mark.parametrize(("backend", "path"), [("delta-spark", "s3a://bucket/tables"),
                                               ("delta-rs", "s3://bucket/tables")])
def test_tables_on_object_storage_render_with_the_checkpoints_on_the_volume(
        backend: str, path: str) -> None:
    manifests = ht.render(set_values={"config.tables": {"backend": backend, "path": path}})
    config = load_config_text(ht.config_text(manifests), source="ConfigMap")
    assert (config.tables.backend, config.tables.path) == (backend, path)
    app = ht.spark_application(manifests)
    assert _mounts(app, "driver")["/var/lib/cursorsync"] == "state"
    assert "state" not in _mounts(app, "executor").values()
    for manifest in manifests:
        ht.validate_manifest(manifest)


def test_executors_mount_the_state_volume_only_when_asked() -> None:
    """delta-spark writing tables on the volume needs it on the executors, and so a
    ReadWriteMany claim."""
    manifests = ht.render(set_values={"config.tables.backend": "delta-spark",
                                      "persistence.executors": True,
                                      "persistence.accessModes": ["ReadWriteMany"]})
    app = ht.spark_application(manifests)
    assert _mounts(app, "driver")["/var/lib/cursorsync"] == "state"
    assert _mounts(app, "executor")["/var/lib/cursorsync"] == "state"
    (claim,) = ht.of_kind(manifests, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for manifest in manifests:
        ht.validate_manifest(manifest)
    # An existing claim: its access modes are the cluster's to know.
    existing = ht.spark_application(ht.render(set_values={
        "persistence.claimName": "shared", "persistence.executors": True}))
    assert _mounts(existing, "executor")["/var/lib/cursorsync"] == "state"
    # Without persistence there is nothing to mount.
    off = ht.spark_application(ht.render(set_values={
        "persistence.enabled": False, "persistence.executors": True,
        "validation.requireDurableState": False}))
    assert "state" not in _volumes(off)
    assert "state" not in {*_mounts(off, "driver").values(), *_mounts(off, "executor").values()}


def test_the_root_file_system_is_read_only_and_what_spark_writes_is_on_empty_dirs(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, manifests = rendered
    app = ht.spark_application(manifests)
    volumes = _volumes(app)
    # The operator hands a volume with this prefix to Spark as its local dir (the
    # prefix as the pinned spark-operator's source defines it).
    source = ht.module_file(ht.SPARK_OPERATOR, "pkg/common/spark.go")
    prefix = re.search(r'SparkLocalDirVolumePrefix\s*=\s*"([^"]+)"', source)
    assert prefix, "SparkLocalDirVolumePrefix moved in spark-operator"
    for role in ("driver", "executor"):
        assert app["spec"][role]["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = _mounts(app, role)
        assert "emptyDir" in volumes[mounts["/tmp"]]
        local = [(path, name) for path, name in mounts.items()
                 if name.startswith(prefix.group(1))]
        assert len(local) == 1 and "emptyDir" in volumes[local[0][1]], role
        # the apache/spark image's WORKDIR, where an executor fetches Spark's files
        assert "emptyDir" in volumes[mounts["/opt/spark/work-dir"]], role
    limited = ht.spark_application(ht.render(set_values={"scratch.sizeLimit": "4Gi"}))
    scratch = [v for v in limited["spec"]["volumes"] if "emptyDir" in v]
    assert len(scratch) == 3 and all(v["emptyDir"] == {"sizeLimit": "4Gi"} for v in scratch)


def test_extra_volumes_priority_and_grace_period_reach_the_pods(
        full: list[dict[str, Any]]) -> None:
    app = ht.spark_application(full)
    assert _volumes(app)["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}
    for role in ("driver", "executor"):
        assert _mounts(app, role)["/var/cache/cursorsync"] == "cache"
        assert app["spec"][role]["priorityClassName"] == "streaming-critical"
    assert app["spec"]["driver"]["terminationGracePeriodSeconds"] == 180
    default = ht.spark_application(ht.render())["spec"]
    # Long enough for the stop on SIGTERM (a batch in flight, acks flushed, lease released).
    assert default["driver"]["terminationGracePeriodSeconds"] == 120
    assert "terminationGracePeriodSeconds" not in default["executor"]
    assert "priorityClassName" not in default["driver"]
    assert "priorityClassName" not in default["executor"]


def test_suspending_stops_the_job_and_keeps_its_service_and_alerts(
        full: list[dict[str, Any]]) -> None:
    """A failover suspends the application (`helm upgrade --set suspend=true`): the
    SparkApplication says so, the alert on the job being down is left out, and every
    other resource and alert renders as before."""
    suspended = ht.render([ht.FULL_VALUES], set_values={"suspend": True})
    assert ht.spark_application(suspended)["spec"]["suspend"] is True
    assert ht.spark_application(full)["spec"]["suspend"] is False
    assert ht.spark_application(ht.render())["spec"]["suspend"] is False
    changed = ("SparkApplication", "PrometheusRule")
    assert [m for m in suspended if m["kind"] not in changed] == [
        m for m in full if m["kind"] not in changed]
    running = ht.alerts(full)
    assert "CursorSyncDown" in {r["alert"] for r in running}
    assert ht.alerts(suspended) == [r for r in running if r["alert"] != "CursorSyncDown"]
    assert "leaves CursorSyncDown out" in ht.notes([ht.FULL_VALUES], {"suspend": True})
    assert "suspended" not in ht.notes([ht.FULL_VALUES])
    for manifest in suspended:
        ht.validate_manifest(manifest)
    with pytest.raises(ht.helm().HelmValuesError, match="schema"):
        ht.render(set_values={"suspend": "yes"})


def _object_keys(schema: dict[str, Any], node: dict[str, Any], path: str,
                 out: dict[str, set[str]]) -> None:
    """Every object's property names in a JSON schema, by key path (refs followed)."""
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        node = schema.get("$defs", schema.get("definitions", {}))[name]
    for option in node.get("anyOf", []):
        _object_keys(schema, option, path, out)
    if "properties" in node:
        out[path] = set(node["properties"])
        assert node.get("additionalProperties") is False, f"{path} admits unknown keys"
        for key, child in node["properties"].items():
            _object_keys(schema, child, f"{path}.{key}", out)
    if "items" in node:
        _object_keys(schema, node["items"], f"{path}[]", out)


def test_the_values_schema_holds_cursorsyncs_own_config_schema() -> None:
    """values.config is checked with the keys cursorsync accepts, at every level."""
    values_schema = json.loads((ht.CHART / "values.schema.json").read_text(encoding="utf-8"))
    in_chart: dict[str, set[str]] = {}
    config_root = {**values_schema["properties"]["config"],
                   "definitions": values_schema["definitions"]}
    _object_keys({"definitions": values_schema["definitions"]}, config_root, "config", in_chart)
    pydantic = Config.model_json_schema()
    in_cursorsync: dict[str, set[str]] = {}
    _object_keys(pydantic, pydantic, "config", in_cursorsync)
    assert in_chart == in_cursorsync


# --------------------------------------------------------------------------- the job


def test_the_config_map_is_a_valid_cursorsync_config(rendered: tuple[str, list[dict[str, Any]]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    case, manifests = rendered
    monkeypatch.setenv("PULSAR_US_EAST_TOKEN", "token-from-the-secret")
    config = load_config_text(ht.config_text(manifests), source=f"{case} ConfigMap")
    app = ht.spark_application(manifests)
    # spark-submit's master (the operator's) decides where the job runs.
    assert config.spark.master is None
    assert config.metrics.host == "0.0.0.0"
    assert app["spec"]["driver"]["ports"] == [
        {"name": "metrics", "protocol": "TCP", "containerPort": config.metrics.port}]
    service = ht.of_kind(manifests, "Service")[0]
    assert service["spec"]["ports"][0]["port"] == config.metrics.port
    expected = yaml.safe_load(ht.FULL_VALUES.read_text())["config"]["emission"][
        "spread_across_executors"] if case == "full" else False
    assert config.emission.spread_across_executors is expected


def test_the_spark_application_runs_the_cli_with_the_pinned_spark(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, manifests = rendered
    spec = ht.spark_application(manifests)["spec"]
    assert (spec["type"], spec["mode"], spec["pythonVersion"]) == ("Python", "cluster", "3")
    assert spec["mainApplicationFile"] == "local:///opt/cursorsync/main.py"
    assert spec["arguments"] == ["run", "--config", "/etc/cursorsync/config.yaml"]
    assert spec["sparkVersion"] == pinned("pyspark")
    assert spec["restartPolicy"]["type"] == "Always"
    assert spec["restartPolicy"]["onFailureRetryInterval"] > 0
    assert spec["restartPolicy"]["onSubmissionFailureRetryInterval"] > 0
    assert spec["sparkConf"]["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert spec["sparkConf"]["spark.sql.catalog.spark_catalog"] == (
        "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    assert spec["sparkConf"]["spark.sql.streaming.metricsEnabled"] == "true"


def test_the_cli_takes_the_arguments_the_chart_gives() -> None:
    from typer.testing import CliRunner

    from cursorsync.app.cli import app

    result = CliRunner().invoke(app, ["run", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--config" in result.output and "-c" in result.output
    driver = (ht.ROOT / "streaming" / "cursorsync" / "__main__.py").read_text(encoding="utf-8")
    assert "from cursorsync.app.cli import main" in driver


def test_chart_versions_follow_the_package() -> None:
    chart = yaml.safe_load((ht.CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2" and chart["version"] == "0.1.0"
    assert chart["appVersion"] == PYPROJECT["project"]["version"]


def test_every_mount_has_its_volume_and_secrets_are_only_referenced(
        full: list[dict[str, Any]]) -> None:
    spec = ht.spark_application(full)["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    values = yaml.safe_load(ht.FULL_VALUES.read_text(encoding="utf-8"))
    for role in ("driver", "executor"):
        mounts = {m["mountPath"]: m["name"] for m in spec[role]["volumeMounts"]}
        assert set(mounts.values()) == set(volumes), role
        for token in values["secrets"]["tokens"]:
            assert volumes[mounts[token["mountPath"]]]["secret"]["secretName"] == token[
                "secretName"]
        tls = values["secrets"]["tls"]
        assert volumes[mounts[tls["mountPath"]]]["secret"]["secretName"] == tls["secretName"]
        env = {e["name"]: e for e in spec[role]["env"]}
        assert env["PULSAR_US_EAST_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "pulsar-us-east-token", "key": "token", "optional": False}
        assert spec[role]["envFrom"] == [
            {"secretRef": {"name": "cursorsync-extra-env", "optional": True}}]
    # The chart never creates a Secret: it mounts existing ones.
    assert not ht.of_kind(full, "Secret")
    assert ht.spark_application(full)["spec"]["driver"]["serviceAccount"] == (
        ht.of_kind(full, "ServiceAccount")[0]["metadata"]["name"])


def test_a_config_change_changes_the_spec() -> None:
    """The operator resubmits an application whose spec changed; the checksum sees to it."""
    def checksums(manifests: list[dict[str, Any]]) -> set[str]:
        spec = ht.spark_application(manifests)["spec"]
        return {spec[role]["annotations"]["checksum/config"] for role in ("driver", "executor")}

    before = ht.render()
    after = ht.render(set_values={"config.spark.trigger_interval_s": 3})
    expected = hashlib.sha256(ht.config_text(before).rstrip("\n").encode()).hexdigest()
    assert checksums(before) == {expected}
    assert checksums(after) != checksums(before) and len(checksums(after)) == 1


# --------------------------------------------------------------------------- metrics


def test_the_service_selects_the_driver_pod_as_the_operator_labels_it(
        full: list[dict[str, Any]]) -> None:
    # The label names as the pinned spark-operator's source defines them.
    source = ht.module_file(ht.SPARK_OPERATOR, "pkg/common/spark.go")
    prefix = re.search(r'LabelAnnotationPrefix\s*=\s*"([^"]+)"', source)
    role = re.search(r'LabelSparkRole\s*=\s*"([^"]+)"', source)
    driver = re.search(r'SparkRoleDriver\s*=\s*"([^"]+)"', source)
    app_name = re.search(r'LabelSparkAppName\s*=\s*LabelAnnotationPrefix \+ "([^"]+)"', source)
    assert prefix and role and driver and app_name, "label constants moved in spark-operator"
    app = ht.spark_application(full)
    service = ht.of_kind(full, "Service")[0]
    assert service["spec"]["selector"] == {
        role.group(1): driver.group(1),
        prefix.group(1) + app_name.group(1): app["metadata"]["name"]}
    assert service["spec"]["ports"][0]["targetPort"] == app["spec"]["driver"]["ports"][0]["name"]
    monitor = ht.of_kind(full, "ServiceMonitor")[0]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]


def test_the_dashboard_config_map_holds_the_dashboard_file(full: list[dict[str, Any]]) -> None:
    dashboards = [m for m in ht.of_kind(full, "ConfigMap")
                  if m["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == 1 and dashboards[0]["metadata"]["namespace"] == "monitoring"
    text = (ht.CHART / "dashboards" / "cursorsync.json").read_text(encoding="utf-8")
    assert json.loads(dashboards[0]["data"]["cursorsync.json"]) == json.loads(text)
    dashboard = json.loads(text)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


# --------------------------------------------------------------------------- the image


def test_the_dockerfile_pins_what_the_package_pins() -> None:
    from cursorsync_devtools.testbed import delta_jars

    text = (ht.ROOT / "helm" / "Dockerfile").read_text(encoding="utf-8")
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
    assert args["SPARK_VERSION"] == pinned("pyspark")
    jars = (ht.ROOT / "helm" / "image" / "jars.txt").read_text(encoding="utf-8")
    assert pinned("delta-spark") == delta_jars.DELTA_VERSION
    assert (f"io.delta:delta-spark_{delta_jars.DELTA_SPARK_SUFFIX}:{delta_jars.DELTA_VERSION} "
            in jars)
    assert re.search(r"^USER 185$", text, re.MULTILINE), "the image must not run as root"
    assert "/opt/cursorsync/main.py" in text
    assert not re.search(r"(?i)(token|password|secret)\s*=", text)


def test_helm_readme_points_at_the_chart() -> None:
    text = (ht.ROOT / "helm" / "README.md").read_text(encoding="utf-8")
    assert "cursorsync/" in text and "docs/deploy.md" in text


def test_the_chart_readme_lists_every_top_level_value() -> None:
    text = (ht.CHART / "README.md").read_text(encoding="utf-8")
    values = yaml.safe_load((ht.CHART / "values.yaml").read_text(encoding="utf-8"))
    missing = [key for key in values if f"`{key}" not in text]
    assert missing == []


# --------------------------------------------------------------------------- Spark's metrics

SPARK_SERVLET = "spark.metrics.conf.*.sink.prometheusServlet.class"


def test_sparks_own_metrics_are_served_on_the_ui_port_and_scraped_as_a_job_of_their_own(
        full: list[dict[str, Any]]) -> None:
    conf = ht.spark_application(full)["spec"]["sparkConf"]
    assert conf[SPARK_SERVLET] == "org.apache.spark.metrics.sink.PrometheusServlet"
    assert conf["spark.ui.prometheus.enabled"] == "true"
    assert conf["spark.metrics.namespace"] == "cursorsync"
    service = ht.of_kind(full, "Service")[0]
    spark_port = next(p for p in service["spec"]["ports"] if p["name"] == "spark-metrics")
    assert str(spark_port["port"]) == str(spark_port["targetPort"]) == conf["spark.ui.port"]
    monitor = ht.of_kind(full, "ServiceMonitor")[0]
    spark = [e for e in monitor["spec"]["endpoints"] if e["port"] == spark_port["name"]]
    assert [e["path"] for e in spark] == ["/metrics/prometheus", "/metrics/executors/prometheus"]
    jobs = {r["replacement"] for e in spark for r in e["relabelings"]
            if r["targetLabel"] == "job"}
    # The alerts select the job's own series by the metrics Service's name: Spark's are apart.
    assert jobs == {"cursorsync-spark"} and service["metadata"]["name"] not in jobs
    assert all(f'job="{service["metadata"]["name"]}"' in rule["expr"]
               for rule in ht.alerts(full) if rule["alert"] == "CursorSyncDown")


def test_spark_conf_overrides_the_metrics_defaults_but_not_the_port_the_service_targets(
        ) -> None:
    manifests = ht.render(set_values={"sparkMetrics.port": 4100, "sparkConf": {
        "spark.ui.port": "4999", "spark.metrics.namespace": "sync-eu"}})
    conf = ht.spark_application(manifests)["spec"]["sparkConf"]
    assert conf["spark.ui.port"] == "4100" and conf["spark.metrics.namespace"] == "sync-eu"
    ports = {p["name"]: p["port"] for p in ht.of_kind(manifests, "Service")[0]["spec"]["ports"]}
    assert ports["spark-metrics"] == 4100
    for m in manifests:
        ht.validate_manifest(m)


def test_sparks_metrics_switched_off_leave_no_trace() -> None:
    manifests = ht.render([ht.FULL_VALUES], {"sparkMetrics.enabled": False})
    conf = ht.spark_application(manifests)["spec"]["sparkConf"]
    assert not [k for k in conf if k.startswith(("spark.metrics.", "spark.ui."))]
    assert [p["name"] for p in ht.of_kind(manifests, "Service")[0]["spec"]["ports"]] == [
        "metrics"]
    assert [e["port"] for e in ht.of_kind(manifests, "ServiceMonitor")[0]["spec"]["endpoints"]
            ] == ["metrics"]


@pytest.mark.parametrize("values", [{"sparkMetrics.port": 0}, {"sparkMetrics.port": "4040"},
                                    {"sparkMetrics.scrape": True}])
def test_bad_spark_metrics_values_fail_the_values_schema(values: dict[str, Any]) -> None:
    with pytest.raises(ht.helm().HelmValuesError, match="schema"):
        ht.render(set_values=values)


def test_the_operators_monitoring_block_means_the_jmx_exporter_agent() -> None:
    """Why the chart leaves spec.monitoring out: the pinned spark-operator acts on it only
    with monitoring.prometheus, the JMX exporter's Java agent (a jar the image does not
    carry); metricsProperties alone is ignored."""
    util = ht.module_file(ht.SPARK_OPERATOR, "pkg/util/sparkapplication.go")
    assert re.search(r"func PrometheusMonitoringEnabled\(app \*v1beta2.SparkApplication\) bool "
                     r"\{\s*return app.Spec.Monitoring != nil && "
                     r"app.Spec.Monitoring.Prometheus != nil\s*\}", util)
    controller = ht.module_file(ht.SPARK_OPERATOR,
                                "internal/controller/sparkapplication/controller.go")
    assert re.search(r"if util.PrometheusMonitoringEnabled\(app\) \{\s*[^}]*"
                     r"configPrometheusMonitoring\(", controller)
    assert "monitoring" not in ht.spark_application(ht.render([ht.FULL_VALUES]))["spec"]


@pytest.mark.parametrize("json_logs", [True, False])
def test_sparks_jvms_log_through_cursorsyncs_log4j_file_under_spark_submit(
        json_logs: bool) -> None:
    """spark-submit starts the JVMs before cursorsync runs, so the chart names the log4j2
    file the image links, in JSON lines as cursorsync's own when config.logging.json is; a
    sparkConf of the same key wins."""
    conf = ht.spark_application(ht.render(set_values={"config.logging.json": json_logs})
                                )["spec"]["sparkConf"]
    for role in ("driver", "executor"):
        options = conf[f"spark.{role}.extraJavaOptions"].split()
        assert "-Dlog4j2.configurationFile=file:/opt/cursorsync/log4j2.properties" in options
        assert ("-Dcursorsync.log4j.appender=json" in options) is json_logs
    mine = ht.spark_application(ht.render(set_values={"sparkConf": {
        "spark.driver.extraJavaOptions": "-Dmine=1"}}))["spec"]["sparkConf"]
    assert mine["spark.driver.extraJavaOptions"] == "-Dmine=1"
    dockerfile = (ht.ROOT / "helm" / "Dockerfile").read_text()
    assert "/opt/cursorsync/log4j2.properties" in dockerfile
    assert (ht.ROOT / "streaming" / "cursorsync" / "app" / "log4j2.properties").is_file()
