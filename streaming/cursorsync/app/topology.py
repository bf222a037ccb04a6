"""The configuration's topics against their replication topology: at ``check``, at the
start of ``run``, and (through the watch the job hands its queries) while it runs."""

from __future__ import annotations

from cursorsync.app.settings import Config
from cursorsync.core.topology import Topology
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.replication import TopologyWatch
from cursorsync.pulsar.topics import TopicName


def topics_in_play(config: Config, source_admin: AdminClient) -> list[str]:
    """The configured topics and the source's topics the namespace rules match now, each
    once (partitioned topics by their own name)."""
    names = {str(TopicName.parse(t.topic).base) for t in config.topics}
    for ns in config.namespaces:
        names |= {str(t.base) for t in source_admin.expand_topics(namespace=ns.namespace,
                                                                  pattern=ns.regex)}
    return sorted(names)


def topology_watch(config: Config, source_admin: AdminClient,
                   target_admin: AdminClient) -> TopologyWatch:
    return TopologyWatch(source_admin, target_admin, config.source.name, config.target.name,
                         config.evidence.strategies,
                         interval_s=config.evidence.topology_check_interval_s)


def check_topologies(config: Config, source_admin: AdminClient,
                     target_admin: AdminClient) -> tuple[TopologyWatch, list[Topology]]:
    """A watch for the job, and the topologies of the topics in play; TopologyError (one
    line naming the topic, its clusters and the strategy) when the configured evidence
    does not hold on one of them."""
    watch = topology_watch(config, source_admin, target_admin)
    return watch, watch.check(topics_in_play(config, source_admin))


__all__ = ["check_topologies", "topics_in_play", "topology_watch"]
