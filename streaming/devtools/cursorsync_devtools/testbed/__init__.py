"""The real test bed: two Apache Pulsar clusters from Maven Central, geo-replicated.

Development tooling: the demo, the tests and the benchmarks run on it; the
product never imports it. :class:`TestBed` starts the pair; the workload and
the failover check that measure cursorsync beside Pulsar's own replicated
subscriptions are in :mod:`cursorsync_devtools.testbed.workload` and
:mod:`cursorsync_devtools.testbed.failover`.
"""

from cursorsync_devtools.testbed.distribution import PULSAR_VERSION, SetupError, ensure_pulsar
from cursorsync_devtools.testbed.standalone import Standalone, StandaloneError, StandaloneSpec
from cursorsync_devtools.testbed.testbed import (
    BROKER_PLUGIN_BUILD,
    SOURCE,
    TARGET,
    TestBed,
    TestBedConfig,
    TestBedError,
    broker_plugin_path,
)

__all__ = [
    "BROKER_PLUGIN_BUILD",
    "PULSAR_VERSION",
    "SOURCE",
    "TARGET",
    "SetupError",
    "Standalone",
    "StandaloneError",
    "StandaloneSpec",
    "TestBed",
    "TestBedConfig",
    "TestBedError",
    "broker_plugin_path",
    "ensure_pulsar",
]
