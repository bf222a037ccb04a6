"""Configuration files fuzzed: round trips, and every mutation, random text or bytes one
ConfigError naming the key."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cursorsync.app.settings import (
    ConfigValidationError,
    load_config,
    load_config_text,
)
from cursorsync.errors import ConfigError
from tests.support.fuzzing import FUZZ, _get, names, paths, render, set_path

# ------------------------------------------------------------------------ config files

MINIMAL: dict[str, Any] = {
    "clusters": {
        "source": {"name": "A", "service_url": "pulsar://127.0.0.1:6650",
                   "admin_url": "http://127.0.0.1:8080"},
        "target": {"name": "B", "service_url": "pulsar://127.0.0.1:6651",
                   "admin_url": "http://127.0.0.1:8081"},
    },
    "topics": [{"topic": "persistent://t/ns/orders", "subscriptions": ["billing", "audit"]}],
    "emission": {"mode": "individual"},
    "tables": {"path": "/tmp/cursorsync/tables"},
    "spark": {"checkpoint_dir": "/tmp/cursorsync/checkpoints", "trigger_interval_s": 5.0},
}

#: Text PyYAML writes and reads back unchanged (it folds NEL and the Unicode line breaks).
yaml_chars = st.characters(exclude_categories=["Cs"],
                           exclude_characters="\x85\u2028\u2029\ufeff")
hosts = st.from_regex(r"[a-z][a-z0-9.-]{0,15}", fullmatch=True)


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    source, target = draw(st.lists(names, min_size=2, max_size=2, unique=True))
    topics = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return {
        "clusters": {
            role: {"name": name,
                   "service_url": f"{draw(st.sampled_from(['pulsar', 'pulsar+ssl']))}://"
                                  f"{draw(hosts)}:{draw(st.integers(1, 65535))}",
                   "admin_url": f"{draw(st.sampled_from(['http', 'https']))}://{draw(hosts)}",
                   "max_concurrency": draw(st.integers(1, 1024)),
                   "request_timeout_s": draw(st.floats(0.001, 1e6)),
                   }
            for role, name in (("source", source), ("target", target))
        },
        "topics": [{"topic": f"persistent://t/ns/{t}",
                    "subscriptions": draw(st.lists(
                        names.filter(lambda n: not n.startswith(("cursorsync-mapping",
                                                                 "pulsar.repl."))),
                        min_size=1, max_size=3, unique=True))}
                   for t in topics],
        # Any path but a Hadoop s3a:// URI, which the default backend (delta-rs) refuses.
        "tables": {"path": draw(st.text(yaml_chars, min_size=1, max_size=20).filter(
            lambda s: "$" not in s and not s.startswith("s3a://")))},
        "spark": {"checkpoint_dir": "/tmp/c", "trigger_interval_s": draw(st.floats(0.01, 1e4))},
    }


@FUZZ
@given(valid_configs())
def test_config_round_trip(data: dict[str, Any]) -> None:
    cfg = load_config_text(yaml.safe_dump(data, allow_unicode=True), source="c.yaml")
    for role in ("source", "target"):
        got = getattr(cfg.clusters, role)
        want = data["clusters"][role]
        assert (got.name, got.service_url, got.max_concurrency, got.request_timeout_s) == (
            want["name"], want["service_url"], want["max_concurrency"],
            want["request_timeout_s"])
        assert got.admin_url == want["admin_url"].rstrip("/")
    assert [(t.topic, t.subscriptions) for t in cfg.topics] == [
        (t["topic"], t["subscriptions"]) for t in data["topics"]]
    assert cfg.tables.path == data["tables"]["path"]
    assert cfg.spark.trigger_interval_s == data["spark"]["trigger_interval_s"]


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(yaml_chars, max_size=10)
    | st.sampled_from(["${CURSORSYNC_FUZZ_UNSET}", "embedded", "-1"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(yaml_chars, max_size=6), inner, max_size=3),
    max_leaves=5,
)
yaml_keys = st.one_of(st.text(yaml_chars, max_size=10), st.integers(), st.booleans(), st.none())


def check_config_error(err: ConfigError, path: tuple[str | int, ...] | None) -> list[str]:
    """The error names the file; a validation error names each problem's key path and line.
    Returns the problem lines."""
    message = str(err)
    assert "c.yaml" in message, message
    if not isinstance(err, ConfigValidationError):
        return []
    assert err.problems
    for problem in err.problems:
        assert re.search(r" \(line \d+\)$", problem), problem
    if path is None:
        return list(err.problems)
    named = re.compile("|".join(re.escape(render(path[:k])) + r"[:.\[]"
                                for k in range(len(path), 0, -1)) or "$^")
    assert any(named.match(p) or p.startswith("(top level):")
               for p in err.problems), (path, err.problems)
    return list(err.problems)


@FUZZ
@given(st.data())
def test_config_mutated_raises_config_error_naming_the_key(data: st.DataObject) -> None:
    doc = copy.deepcopy(MINIMAL)
    path = data.draw(st.sampled_from(list(paths(doc))), label="path")
    action = data.draw(st.sampled_from(["type", "delete", "unknown", "nest"]), label="action")
    unknown: tuple[str | int, ...] | None = None
    if action == "type":
        set_path(doc, path, data.draw(yaml_values, label="value"))
    elif action == "delete":
        set_path(doc, path, None, delete=True)
    elif action == "nest":
        current = _get(doc, path)
        set_path(doc, path, data.draw(st.sampled_from([[current], {"x": current}]), label="nest"))
    else:
        mappings = [()] + [p for p in paths(doc) if isinstance(_get(doc, p), dict)]
        where = data.draw(st.sampled_from(mappings), label="mapping")
        key = data.draw(yaml_keys.filter(lambda k: k not in _get(doc, where)), label="key")
        _get(doc, where)[key] = data.draw(yaml_values, label="value")
        path = (*where, key) if isinstance(key, str) else (*where, str(key))
        unknown = path if isinstance(key, str) and key else None
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    try:
        load_config_text(text, source="c.yaml")
    except ConfigError as err:
        problems = check_config_error(err, path)
        if unknown is not None:
            assert any(re.match(re.escape(render(unknown)) + r"[:.\[]", p)
                       for p in problems), (unknown, problems)
    else:
        assert action != "unknown" or unknown is None


YAML_ALPHABET = "abc:-[]{},&*!|>'\"%@`?# \n\t0123456789.$"


@FUZZ
@given(st.one_of(st.text(max_size=80), st.text(alphabet=YAML_ALPHABET, max_size=80)))
def test_config_random_text(text: str) -> None:
    try:
        load_config_text(text, source="c.yaml")
    except ConfigError as err:
        check_config_error(err, None)


def test_config_unhashable_and_non_string_keys() -> None:
    for text, expected in [("? [a]\n: b\n", r"^c\.yaml:1:3: bad YAML: .*unhashable"),
                           ("{[a]: b}\n", r"^c\.yaml:1:2: bad YAML: .*unhashable"),
                           ("clusters: {? {a: 1} : b}\n", r"^c\.yaml:1:14: bad YAML: "),
                           ("a: &x [*x]\n", r"^c\.yaml:1:\d+: bad YAML: .*recursive")]:
        with pytest.raises(ConfigError, match=expected):
            load_config_text(text, source="c.yaml")
    with pytest.raises(ConfigValidationError) as info:
        load_config_text("1: 2\n", source="c.yaml")
    assert "(top level): key 1 is not a string; keys are names (line 1)" in info.value.problems


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=60))
def test_config_file_of_random_bytes(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(raw)
    try:
        load_config(path)
    except ConfigError as err:
        assert str(path) in str(err)
        check_config_error(err, None)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            assert f"byte {exc.start}" in str(err)
