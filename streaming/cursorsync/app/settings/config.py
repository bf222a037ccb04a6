"""The whole configuration: every section, and the checks that span sections."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, ValidationError, model_validator

from cursorsync.app.settings.base import EMBEDDED, _invalid, _Section
from cursorsync.app.settings.clusters import ClusterConfig, ClustersConfig
from cursorsync.app.settings.messages import ConfigValidationError, describe
from cursorsync.app.settings.runtime import (
    LoggingConfig,
    MetricsConfig,
    SparkConfig,
    TablesConfig,
)
from cursorsync.app.settings.sync import EmissionConfig, EvidenceConfig, NamespaceSpec, TopicSpec
from cursorsync.errors import ConfigError


class Config(_Section):
    """The whole configuration (see conf/production.example.yaml for every key)."""

    clusters: ClustersConfig
    topics: list[TopicSpec] = Field(default_factory=list)
    namespaces: list[NamespaceSpec] = Field(default_factory=list)
    evidence: EvidenceConfig = Field(default_factory=EvidenceConfig)
    emission: EmissionConfig = Field(default_factory=EmissionConfig)
    tables: TablesConfig
    spark: SparkConfig
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _something_to_sync(self) -> Self:
        if not self.topics and not self.namespaces:
            raise _invalid("nothing to sync: give at least one entry in topics or namespaces")
        seen: set[str] = set()
        for spec in self.topics:
            if spec.topic in seen:
                raise _invalid(f"topic {spec.topic!r} is listed twice in topics")
            seen.add(spec.topic)
        return self

    @property
    def source(self) -> ClusterConfig:
        return self.clusters.source

    @property
    def target(self) -> ClusterConfig:
        return self.clusters.target

    def with_cluster(
        self, role: Literal["source", "target"], *, service_url: str, admin_url: str
    ) -> Config:
        """A copy with one cluster's URLs filled in (how the test bed resolves ``embedded``)."""
        if role not in ("source", "target"):
            raise ConfigError(f"{role!r} is not a cluster role. Valid values are: source, target")
        cluster = getattr(self.clusters, role)
        data = {
            **cluster.model_dump(by_alias=True, exclude_none=True),
            "service_url": service_url,
            "admin_url": admin_url,
        }
        try:
            resolved = ClusterConfig.model_validate(data)
        except ValidationError as exc:
            problems = [describe(e, Config, prefix=("clusters", role))
                        for e in exc.errors()]
            raise ConfigValidationError("<with_cluster>", problems) from None
        clusters = self.clusters.model_copy(update={role: resolved})
        return self.model_copy(update={"clusters": clusters})

    def require_resolved(self) -> None:
        """Fail, naming the key, if a cluster URL is still the ``embedded`` marker."""
        problems = [
            f"clusters.{role}.{key}: {EMBEDDED!r} is filled in only by the embedded test bed "
            "(cursorsync-dev demo); give a real URL to run against real clusters"
            for role in ("source", "target")
            for key in ("service_url", "admin_url")
            if getattr(getattr(self.clusters, role), key) == EMBEDDED
        ]
        if problems:
            raise ConfigValidationError("<config>", problems)
