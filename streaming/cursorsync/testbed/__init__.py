"""The real test bed: two Apache Pulsar clusters from Maven Central, geo-replicated.

Development tooling: the demo, the tests and the benchmarks run on it; the
product never imports it. :class:`TestBed` starts the pair; the workload and
the failover check that measure cursorsync beside Pulsar's own replicated
subscriptions are in :mod:`cursorsync.testbed.workload` and
:mod:`cursorsync.testbed.failover`.
"""

from cursorsync.testbed.distribution import PULSAR_VERSION, SetupError, ensure_pulsar
from cursorsync.testbed.standalone import Standalone, StandaloneError, StandaloneSpec
from cursorsync.testbed.testbed import SOURCE, TARGET, TestBed, TestBedConfig, TestBedError

__all__ = [
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
    "ensure_pulsar",
]
