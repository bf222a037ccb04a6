"""The configuration's topics against their replication topology: at ``check``, at the
start of ``run``, and (through the watch the job hands its queries) while it runs."""

from __future__ import annotations

import logging

from cursorsync.app.settings import Config
from cursorsync.core.topology import Topology
from cursorsync.errors import AdminUnavailableError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.replication import TopologyWatch
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)


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


def start_topologies(config: Config, source_admin: AdminClient,
                     target_admin: AdminClient) -> TopologyWatch:
    """:func:`check_topologies` at a job's start. A cluster that does not answer (a job
    restarted while it is down) does not stop the start: the mapping query reads each
    topic's replication before it maps a batch of it, and waits for the cluster as it
    waits for any admin request; until then the sync plans with identity's segments."""
    try:
        return check_topologies(config, source_admin, target_admin)[0]
    except AdminUnavailableError as err:
        log.warning("the topics' replication clusters cannot be read now (%s); they are "
                    "read again before the mapping maps a batch", err)
        return topology_watch(config, source_admin, target_admin)


__all__ = ["check_topologies", "start_topologies", "topics_in_play", "topology_watch"]
