"""The selection syncs exactly the (topic, subscription) pairs the configuration names."""

from __future__ import annotations

import pytest

from cursorsync.app.settings import parse_config
from cursorsync.app.streams import selection
from cursorsync.errors import ConfigError
from cursorsync.pulsar.selection import NamespaceRule, Selection, TopicRule

CLUSTERS = {"source": {"name": "A", "service_url": "pulsar://h:6650",
                       "admin_url": "http://h:8080"},
            "target": {"name": "B", "service_url": "pulsar://h:6651",
                       "admin_url": "http://h:8081"}}


def test_each_topic_gets_its_own_subscriptions_and_every_namespace_counts() -> None:
    config = parse_config({
        "clusters": CLUSTERS,
        "topics": [{"topic": "persistent://t/a/orders", "subscriptions": ["billing"]},
                   {"topic": "persistent://t/a/users", "subscriptions": ["audit"]}],
        "namespaces": [{"namespace": "t/b", "regex": "pay-.*", "subscriptions": ["ledger"]},
                       {"namespace": "t/c", "subscriptions": ["all"]}],
        "tables": {"path": "/tmp/t"}, "spark": {"checkpoint_dir": "/tmp/c"}})
    sel = selection(config)
    assert sel.subscriptions_of("persistent://t/a/orders") == ("billing",)
    assert sel.subscriptions_of("persistent://t/a/orders-partition-3") == ("billing",)
    assert sel.subscriptions_of("persistent://t/a/users") == ("audit",)
    assert sel.subscriptions_of("persistent://t/b/pay-eu-partition-0") == ("ledger",)
    assert sel.subscriptions_of("persistent://t/b/other") == ()
    assert sel.subscriptions_of("persistent://t/c/anything") == ("all",)
    assert Selection.from_option(sel.to_option()) == sel


def test_rules_that_cover_one_topic_add_up_and_a_partition_rule_covers_only_it() -> None:
    sel = Selection((TopicRule("persistent://t/a/x-partition-1", ("p1",)),
                     TopicRule("persistent://t/a/x", ("whole",))),
                    (NamespaceRule("t/a", "x", ("ns",)),))
    assert sel.subscriptions_of("persistent://t/a/x-partition-1") == ("ns", "p1", "whole")
    assert sel.subscriptions_of("persistent://t/a/x-partition-0") == ("ns", "whole")


def test_the_short_form_and_bad_selections() -> None:
    sel = Selection.of(["persistent://t/a/x"], subscriptions=["s"])
    assert sel.subscriptions_of("persistent://t/a/x") == ("s",)
    assert Selection.of(namespace="t/a").subscriptions_of("persistent://t/a/y") == ("*",)
    with pytest.raises(ConfigError, match="no topic and no namespace"):
        Selection()
    with pytest.raises(ConfigError, match="option selection"):
        Selection.from_option("{not json")
    with pytest.raises(ConfigError, match="not a valid regex"):
        Selection(namespaces=(NamespaceRule("t/a", "(", ("s",)),))
