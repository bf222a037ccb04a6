"""The Delta jars for delta-spark: from the cache once fetched, one version paired."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cursorsync.tables.delta_spark import (
    DELTA_JARS_ENV,
    delta_package,
    find_delta_jars,
)
from cursorsync_devtools.testbed.delta_jars import DELTA_VERSION, ensure_delta_jars
from tests.support.delta_spark import _delta_jars

# ---------------------------------------------------- delta-spark specifics


def test_delta_jars_come_from_the_cache_once_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    jars = _delta_jars()
    assert [j.name for j in jars] == [f"delta-spark_4.2_2.13-{DELTA_VERSION}.jar",
                                      f"delta-storage-{DELTA_VERSION}.jar"]

    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"Maven ran although the jars are cached: {args}")

    monkeypatch.setattr("cursorsync_devtools.testbed.distribution.subprocess.run", no_maven)
    assert ensure_delta_jars() == jars
    # What a user does with such a Maven-layout copy: name its directories.
    monkeypatch.setenv(DELTA_JARS_ENV, os.pathsep.join(str(j.parent) for j in jars))
    assert find_delta_jars() == tuple(jars)
    # The jars are the ones the pip package's own helper (delta.pip_utils) would name.
    assert delta_package() == f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"


def test_find_delta_jars_pairs_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no Ivy cache
    maven, ivy = tmp_path / "maven", tmp_path / "ivy"
    for d, names in ((maven, ["delta-spark_4.2_2.13-4.4.0.jar",
                              "delta-spark_4.2_2.13-4.4.0-sources.jar",
                              "delta-storage-4.3.0.jar"]),
                     (ivy, ["io.delta_delta-storage-4.4.0.jar"])):
        d.mkdir()
        for n in names:
            (d / n).touch()
    monkeypatch.setenv(DELTA_JARS_ENV, str(maven))
    assert find_delta_jars() == ()  # delta-storage 4.3.0 does not go with delta-spark 4.4.0
    monkeypatch.setenv(DELTA_JARS_ENV, os.pathsep.join([str(maven), str(ivy)]))
    assert find_delta_jars() == (maven / "delta-spark_4.2_2.13-4.4.0.jar",
                                 ivy / "io.delta_delta-storage-4.4.0.jar")
