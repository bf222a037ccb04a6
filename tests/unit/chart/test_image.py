"""The image's jar step: helm/image/jars.txt names the jars the tests run the job with, the
Dockerfile puts them into Spark's jars folder with fetch_jars.py, and fetch_jars.py takes
only the bytes jars.txt pins. (tests/integration/tables/test_s3.py runs the step into a
clean folder and the job on its output.)"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path
from types import ModuleType

import pytest

from cursorsync_devtools.testbed.delta_jars import DELTA_ARTIFACTS
from cursorsync_devtools.testbed.s3a_jars import HADOOP_VERSION, S3A_ARTIFACTS
from tests.support.paths import ROOT

IMAGE = ROOT / "helm" / "image"


def fetch_jars() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_jars", IMAGE / "fetch_jars.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_carries_the_jars_the_tests_run_with() -> None:
    listed = [f"{g}:{a}:{v}" for g, a, v, _ in fetch_jars().read_manifest(IMAGE / "jars.txt")]
    assert listed == [f"{a.group}:{a.artifact}:{a.version}"
                      for a in (*DELTA_ARTIFACTS, *S3A_ARTIFACTS)]


def test_hadoop_aws_matches_the_hadoop_inside_pyspark() -> None:
    import pyspark

    jars = os.listdir(Path(pyspark.__file__).parent / "jars")
    versions = {m[1] for j in jars if (m := re.fullmatch(r"hadoop-client-api-(.+)\.jar", j))}
    assert versions == {HADOOP_VERSION}


def test_the_dockerfile_runs_the_jar_step_into_sparks_jars() -> None:
    dockerfile = (ROOT / "helm" / "Dockerfile").read_text()
    assert "COPY helm/image/jars.txt helm/image/fetch_jars.py /tmp/image/" in dockerfile
    assert re.search(r"RUN python3 /tmp/image/fetch_jars.py /tmp/image/jars.txt "
                     r"\$\{SPARK_HOME\}/jars --maven \$\{MAVEN\}", dockerfile)
    # no jar added past the step's checks
    assert "ADD " not in dockerfile


def _repo_with(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    jar = tmp_path / "repo" / "org" / "example" / "lib" / "1.0" / "lib-1.0.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(data)
    manifest = tmp_path / "jars.txt"
    manifest.write_text("# a comment\norg.example:lib:1.0 "
                        f"{hashlib.sha256(b'the pinned bytes').hexdigest()}\n")
    return tmp_path / "repo", manifest


def test_a_jar_with_the_pinned_digest_is_placed_readable(tmp_path: Path) -> None:
    repo, manifest = _repo_with(tmp_path, b"the pinned bytes")
    (placed,) = fetch_jars().fetch(manifest, tmp_path / "jars", repo.as_uri())
    assert placed == tmp_path / "jars" / "lib-1.0.jar"
    assert placed.read_bytes() == b"the pinned bytes" and placed.stat().st_mode & 0o044


def test_a_jar_with_another_digest_is_refused_naming_it(tmp_path: Path) -> None:
    repo, manifest = _repo_with(tmp_path, b"other bytes")
    module = fetch_jars()
    with pytest.raises(module.JarError, match=r"org\.example:lib:1\.0: .* has SHA-256"):
        module.fetch(manifest, tmp_path / "jars", repo.as_uri())
    assert not list((tmp_path / "jars").iterdir())
