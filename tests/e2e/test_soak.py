"""The soak: ``cursorsync run`` as a process of its own under live traffic (late acks,
holes for good), one broker restarted halfway, then failover to b.

Both run with ``CURSORSYNC_SLOW=1`` (the broker faults and the job's kills of
test_faults.py run in every run): 1.5 minutes of traffic, and the 30-minute soak whose
figures docs/performance.md reports (``cursorsync-dev bench soak`` prints them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cursorsync_devtools.soak import SoakSpec, soak
from cursorsync_devtools.soak_table import table

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _check(report: dict, spec: SoakSpec) -> None:
    f = report["failover"]
    assert f["losses"] == 0, f
    assert f["unexplained"] == 0, f  # b covered every ack before the job stopped
    assert f["messages"] == report["messages"] > spec.rate_per_s * spec.seconds * 0.9
    assert f["acked_on_source"] < f["messages"]  # holes for good: never acked on a
    assert f["deliveries"] >= f["messages"] - f["acked_on_source"]
    assert report["restart"]["writable_after_s"] > 0  # the broker did go down and come back
    assert report["job"]["exit_code"] == 0  # SIGTERM stops it cleanly
    assert report["job"]["acks_sent"] > 0
    windows = report["windows"]
    assert len(windows) == spec.windows
    assert all(w["never_covered"] == 0 and w["entries"] > 0 for w in windows)
    assert all(w["rss_mib"] for w in windows)  # the job's memory was sampled all along


def test_a_short_soak_with_a_target_broker_restart(tmp_path: Path) -> None:
    spec = SoakSpec(minutes=1.5, late_delay_s=(1.0, 20.0), sample_interval_s=5.0,
                    settle_timeout_s=180.0)
    report = soak(spec, work_dir=str(tmp_path))
    print(table(report))
    _check(report, spec)


def test_the_30_minute_soak(tmp_path: Path) -> None:
    """Memory stays flat: the last window's resident set within a quarter of the second
    window's (the first includes Spark's warm-up)."""
    spec = SoakSpec(minutes=30)
    report = soak(spec, work_dir=str(tmp_path))
    print(table(report))
    _check(report, spec)
    second, last = report["windows"][1]["rss_mib"], report["windows"][-1]["rss_mib"]
    assert last["total"] <= 1.25 * second["total"], (second, last)
