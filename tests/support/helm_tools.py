"""The Helm chart under test, rendered and validated with the real tools.

- Helm: PyPI's ``helm-python-sdk`` (Helm's Go SDK as a shared library; no binary).
- Kubernetes kinds: the JSON schemas of PyPI's ``kubernetes-validate``, strict.
- Custom resources: the CRDs of the spark-operator and the prometheus-operator, taken
  from their Go modules through the Go module proxy (pinned versions, checked digests,
  cached under ``~/.cache/cursorsync/crds``), their openAPIV3Schema turned into JSON
  schema that refuses unknown fields.
- promtool: Debian's ``prometheus`` package.

A missing tool fails the test with what to install; nothing is skipped.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import re
import shutil
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "cursorsync"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks"

RELEASE = "cursorsync"
NAMESPACE = "cursorsync"
#: What a cluster with the prometheus-operator serves; the chart renders its ServiceMonitor
#: and PrometheusRule only then.
MONITORING_APIS: tuple[str, ...] = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
#: The Kubernetes version the core kinds are validated for (kubernetes-validate's schemas).
KUBE_VERSION = "1.33.0"

#: The Go modules the CRDs come from: (module path, version, sha256 of the module zip).
SPARK_OPERATOR = (
    "github.com/kubeflow/spark-operator/v2", "v2.5.0",
    "cabf1a6bd7325f82e6f05569e2b7dd1c76ee835dc776a7c23d2f5dfc4f1eead8",
)
PROMETHEUS_OPERATOR = (
    "github.com/prometheus-operator/prometheus-operator", "v0.88.0",
    "d95534b2a114265487b1c223ada9ead2181b5d11747e68a06d53d5f1485dc8c0",
)
GO_PROXY = "https://proxy.golang.org"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cursorsync" / "crds"

_SPARK_CRDS = "charts/spark-operator-chart/crds"
_PROMETHEUS_CRDS = "example/prometheus-operator-crd"
#: (apiVersion, kind) -> (module, path of its CRD inside the module).
CRD_FILES: dict[tuple[str, str], tuple[tuple[str, str, str], str]] = {
    ("sparkoperator.k8s.io/v1beta2", "SparkApplication"): (
        SPARK_OPERATOR, f"{_SPARK_CRDS}/sparkoperator.k8s.io_sparkapplications.yaml"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        PROMETHEUS_OPERATOR, f"{_PROMETHEUS_CRDS}/monitoring.coreos.com_servicemonitors.yaml"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): (
        PROMETHEUS_OPERATOR, f"{_PROMETHEUS_CRDS}/monitoring.coreos.com_prometheusrules.yaml"),
}


# --------------------------------------------------------------------------- Helm


def helm() -> Any:
    """The helm_python module, or a failed test saying what to install."""
    try:
        import helm_python
    except ImportError:
        pytest.fail("helm-python-sdk is not installed: pip install -e '.[test]' "
                    "(it bundles Helm's Go SDK as libhelm_c)")
    return helm_python


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """What Helm does with several -f files: maps merge, everything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def user_values(values_files: Iterable[Path] = (), set_values: Mapping[str, Any] | None = None,
                ) -> dict[str, Any]:
    """The values files merged in order, then ``set_values`` (``{"a.b": 1}`` like --set,
    or nested mappings); the chart's defaults are merged under them by Helm."""
    merged: dict[str, Any] = {}
    for path in values_files:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        merged = _deep_merge(merged, loaded)
    for key, value in (set_values or {}).items():
        nested: Any = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        merged = _deep_merge(merged, nested)
    return merged


def render_templates(values_files: Iterable[Path] = (), set_values: Mapping[str, Any] | None = None,
                     api_versions: Sequence[str] = MONITORING_APIS, *, name: str = RELEASE,
                     namespace: str = NAMESPACE) -> dict[str, str]:
    """``helm template``: template path -> rendered text (NOTES.txt included).

    Raises helm_python.HelmValuesError when the values break values.schema.json and
    HelmRenderError when a template fails.
    """
    h = helm()
    from helm_python import _native  # the render options the wrapper does not expose

    # Chart.render takes no capabilities; the library's options do (as `helm template
    # --api-versions`), so the call goes to it directly.
    options = {"name": name, "namespace": namespace, "api_versions": list(api_versions),
               "is_install": True}
    with h.Chart.load(CHART) as chart:
        rendered = _native.call_string("helm_render", chart._raw(),
                                       json.dumps(user_values(values_files, set_values)),
                                       json.dumps(options))
    out: dict[str, str] = json.loads(rendered)
    return out


def render(values_files: Iterable[Path] = (), set_values: Mapping[str, Any] | None = None,
           api_versions: Sequence[str] = MONITORING_APIS, *, name: str = RELEASE,
           namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The rendered manifests as dicts, in template order (NOTES.txt and empty documents
    left out)."""
    manifests: list[dict[str, Any]] = []
    templates = render_templates(values_files, set_values, api_versions, name=name,
                                 namespace=namespace)
    for path in sorted(templates):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(templates[path]):
            if doc:
                manifests.append(doc)
    return manifests


def notes(values_files: Iterable[Path] = (), set_values: Mapping[str, Any] | None = None,
          api_versions: Sequence[str] = MONITORING_APIS) -> str:
    templates = render_templates(values_files, set_values, api_versions)
    return next(text for path, text in templates.items() if path.endswith("NOTES.txt"))


def lint(values_files: Iterable[Path] = (), set_values: Mapping[str, Any] | None = None,
         ) -> dict[str, Any]:
    """``helm lint --strict``: {"messages": [{"severity", "path", "error"}], "errors": [...]}."""
    report: dict[str, Any] = helm().lint(CHART, user_values(values_files, set_values),
                                         strict=True, namespace=NAMESPACE)
    return report


def of_kind(manifests: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(m) for m in manifests if m.get("kind") == kind]


def spark_application(manifests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The one SparkApplication among the manifests."""
    found = of_kind(manifests, "SparkApplication")
    if len(found) != 1:
        raise AssertionError(f"expected one SparkApplication, rendered {len(found)}")
    return found[0]


def config_text(manifests: Iterable[Mapping[str, Any]]) -> str:
    """The cursorsync config file the chart's ConfigMap holds."""
    app = spark_application(manifests)
    name = next(v["configMap"]["name"] for v in app["spec"]["volumes"] if v["name"] == "config")
    cm = next(m for m in of_kind(manifests, "ConfigMap") if m["metadata"]["name"] == name)
    text: str = cm["data"]["config.yaml"]
    return text


def prometheus_rules(manifests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rules file ({"groups": [...]})."""
    rules = of_kind(manifests, "PrometheusRule")
    if len(rules) != 1:
        raise AssertionError(f"expected one PrometheusRule, rendered {len(rules)}")
    spec: dict[str, Any] = rules[0]["spec"]
    return spec


def alerts(manifests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in prometheus_rules(manifests)["groups"] for r in g["rules"] if "alert" in r]


# --------------------------------------------------------------------------- schemas


def _fetch_module(module: tuple[str, str, str]) -> Path:
    """The module's zip from the Go module proxy, cached, checked against its pinned digest."""
    path, version, digest = module
    target = CACHE / f"{path.replace('/', '+')}@{version}.zip"
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
        return target
    # The proxy escapes capital letters in module paths as !lowercase.
    escaped = re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), path)
    url = f"{GO_PROXY}/{escaped}/@v/{version}.zip"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except OSError as exc:
        pytest.fail(f"cannot download {url} (the CRDs come from the Go module proxy): {exc}")
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        pytest.fail(f"{url}: sha256 {got}, expected the pinned {digest}")
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(target)
    return target


@cache
def module_file(module: tuple[str, str, str], inner: str) -> str:
    """One file of a Go module, as text."""
    path, version, _ = module
    with zipfile.ZipFile(_fetch_module(module)) as archive:
        return archive.read(f"{path}@{version}/{inner}").decode("utf-8")


@cache
def crd(api_version: str, kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind, as the operator's module ships it."""
    module, inner = CRD_FILES[(api_version, kind)]
    loaded: dict[str, Any] = yaml.safe_load(io.StringIO(module_file(module, inner)))
    return loaded


def openapi_to_jsonschema(node: Any) -> Any:
    """An openAPIV3Schema as a JSON schema that refuses what the API server would drop.

    - an object with ``properties`` refuses other keys (``additionalProperties: false``),
      unless ``x-kubernetes-preserve-unknown-fields`` keeps them, as the server does;
    - ``x-kubernetes-int-or-string`` is an integer or a string;
    - ``nullable`` adds null to the type;
    - an inline ``(?i)`` in a pattern moves to its start (RE2 allows it anywhere);
    - the other ``x-kubernetes-*`` markers (list types, validations) are left out.
    """
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: openapi_to_jsonschema(v) for k, v in value.items()}
        elif key == "pattern" and "(?i)" in value:
            # Go's RE2 takes an inline flag anywhere; Python's re only at the start.
            out[key] = "(?i)" + value.replace("(?i)", "")
        else:
            out[key] = openapi_to_jsonschema(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    definition = crd(api_version, kind)
    version = api_version.split("/")[1]
    served = next(v for v in definition["spec"]["versions"] if v["name"] == version)
    schema = openapi_to_jsonschema(served["schema"]["openAPIV3Schema"])
    # metadata is checked against Kubernetes' own ObjectMeta (see validate_manifest).
    schema["properties"]["metadata"] = {"type": "object"}
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft7Validator)
    validator_class.check_schema(schema)
    validator: jsonschema.protocols.Validator = validator_class(schema)
    return validator


def kubernetes_validate() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install -e '.[test]'")
    return kubernetes_validate


def _object_meta_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A ConfigMap carrying the manifest's metadata: Kubernetes' strict ObjectMeta schema
    then checks names, labels and annotations of custom resources too."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(manifest["metadata"])}


def validate_manifest(manifest: Mapping[str, Any]) -> None:
    """Raise jsonschema.ValidationError (or kubernetes_validate's) when the manifest is not
    valid for its kind: a core kind against Kubernetes' strict schemas, a custom resource
    against its CRD."""
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    kv = kubernetes_validate()
    if key in CRD_FILES:
        crd_validator(*key).validate(manifest)
        kv.validate(_object_meta_manifest(manifest), KUBE_VERSION, strict=True)
    else:
        kv.validate(dict(manifest), KUBE_VERSION, strict=True)


# --------------------------------------------------------------------------- promtool


def promtool() -> str:
    """The promtool binary, or a failed test saying what to install."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: apt-get install prometheus (Debian's "
                    "package ships /usr/bin/promtool; .ci/run installs it)")
    return found
