"""The cursorsync configuration: typed, validated, loaded from one YAML file.

Every section is a frozen pydantic model that rejects unknown keys, so a typo
(``clusters.source.colour``) is an error instead of a silently ignored
setting. :func:`load_config` turns every validation problem into one line
that names the full key path and what would be valid, and raises them all at
once as a :class:`ConfigValidationError` (a :class:`~cursorsync.errors.ConfigError`):

    emission.mode: 'fast' is not a valid mode. Valid values are: cumulative-where-allowed, ...
    clusters.source.colour: unknown key. Valid keys are: admin_url, auth, max_concurrency, ...

List items are written ``topics[0].subscriptions``. When the config came from a
file, each line ends with `` (file.yaml line N)``.

Environment variables
---------------------
String values (never keys) may reference environment variables, so secrets
stay out of the file:

* ``${NAME}``: the value of ``NAME``; an error naming the key and the variable if it is
  unset or empty.
* ``${NAME:-default}``: the value of ``NAME``, or ``default`` if unset or empty.
* ``$$``: a literal ``$``. A ``$`` not followed by ``{`` or ``$`` is kept as is
  (regular expressions can end with ``$``).

Expansion happens after YAML parsing, on string scalars only, so a variable's
value can never change the structure of the file.

The embedded test bed
---------------------
``service_url: embedded`` and ``admin_url: embedded`` (:data:`EMBEDDED`) mean
"filled in at runtime by the test bed": ``cursorsync-dev demo`` starts two local
Apache Pulsar clusters on free loopback ports and calls
:meth:`Config.with_cluster` with the real URLs. A job started with unresolved
``embedded`` URLs fails in :meth:`Config.require_resolved` with the key named.

Relative paths (``tables.path``, ``spark.checkpoint_dir``, TLS files) are
relative to the working directory of the process, not to the config file.
``spark.checkpoint_dir`` is local: a ``file:`` URI is taken as its path, and a URI of
any other scheme is refused.
"""

from cursorsync.app.settings.base import (
    DEFAULT_SOURCE_POSITION_PROPERTY,
    EMBEDDED,
    EMBEDDED_CONFIG_PATH,
    EmissionMode,
    EvidenceStrategy,
    Holes,
    IdentityField,
    IdentityScope,
    LogLevel,
    TableBackend,
)
from cursorsync.app.settings.clusters import AuthConfig, ClusterConfig, ClustersConfig, TlsConfig
from cursorsync.app.settings.config import Config
from cursorsync.app.settings.loading import load_config, load_config_text, parse_config
from cursorsync.app.settings.messages import ConfigValidationError
from cursorsync.app.settings.runtime import (
    LoggingConfig,
    MetricsConfig,
    SparkConfig,
    TablesConfig,
)
from cursorsync.app.settings.sync import (
    MAPPING_SUBSCRIPTION_PREFIX,
    EmissionConfig,
    EvidenceConfig,
    NamespaceSpec,
    TopicSpec,
)

__all__ = [
    "DEFAULT_SOURCE_POSITION_PROPERTY",
    "EMBEDDED",
    "EMBEDDED_CONFIG_PATH",
    "MAPPING_SUBSCRIPTION_PREFIX",
    "AuthConfig",
    "ClusterConfig",
    "ClustersConfig",
    "Config",
    "ConfigValidationError",
    "EmissionConfig",
    "EmissionMode",
    "EvidenceConfig",
    "EvidenceStrategy",
    "Holes",
    "IdentityField",
    "IdentityScope",
    "LogLevel",
    "LoggingConfig",
    "MetricsConfig",
    "NamespaceSpec",
    "SparkConfig",
    "TableBackend",
    "TablesConfig",
    "TlsConfig",
    "TopicSpec",
    "load_config",
    "load_config_text",
    "parse_config",
]
