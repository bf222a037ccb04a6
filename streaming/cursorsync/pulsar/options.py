"""Connection settings as Spark data-source options, both ways, and typed option getters.

The driver turns a cluster's settings into string options
(:func:`client_options`, :func:`admin_options`); the data sources parse them
back (:meth:`Options.client`, :meth:`Options.admin`). Both directions live
here, so an option name is spelled once. Spark hands options over as a
case-insensitive map of strings; every getter looks a key up
case-insensitively and raises ConfigError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from cursorsync.errors import ConfigError
from cursorsync.pulsar.admin import AdminSettings
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.topics import TopicName


class Options:
    """Case-insensitive view of string options with typed, validated getters."""

    def __init__(self, raw: Mapping[str, str]) -> None:
        self._raw = {str(k).lower(): v for k, v in raw.items()}

    def get_str(self, key: str, default: str | None = None, *,
                required: bool = False) -> str | None:
        value = self._raw.get(key.lower())
        if value is None or str(value).strip() == "":
            if required:
                raise ConfigError(f"option {key} is required")
            return default
        return str(value).strip()

    def required(self, key: str) -> str:
        value = self.get_str(key, required=True)
        assert value is not None
        return value

    def get_list(self, key: str) -> tuple[str, ...]:
        value = self.get_str(key)
        return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()

    def get_int(self, key: str, default: int | None = None, *, minimum: int | None = None
            ) -> int | None:
        value = self.get_str(key)
        if value is None:
            return default
        try:
            n = int(value)
        except ValueError as e:
            raise ConfigError(f"option {key} must be an integer, got {value!r}") from e
        if minimum is not None and n < minimum:
            raise ConfigError(f"option {key} must be at least {minimum}, got {n}")
        return n

    def get_bool(self, key: str, default: bool = False) -> bool:
        value = self.get_str(key)
        if value is None:
            return default
        low = value.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigError(f"option {key} must be true or false, got {value!r}")

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = (self.get_str(key) or default).lower()
        if value not in choices:
            raise ConfigError(
                f"option {key}: {value!r} is not valid. Valid values are: {', '.join(choices)}"
            )
        return value

    def topic_selection(self) -> tuple[tuple[str, ...], str | None, str | None]:
        """Options topics, namespace and topicPattern: (topics, namespace, pattern), names
        validated; topics or a namespace is required, and a pattern needs the namespace."""
        topics = self.get_list("topics")
        for t in topics:
            TopicName.parse(t)
        namespace = self.get_str("namespace")
        pattern = self.get_str("topicPattern")
        if not topics and not namespace:
            raise ConfigError("option topics (or namespace, with adminUrl) is required")
        if pattern and not namespace:
            raise ConfigError("option topicPattern needs option namespace")
        return topics, namespace, pattern

    def client(self, service_url: str) -> ClientSettings:
        """The pulsar-client settings (authToken, tls*, operationTimeoutSeconds...)."""
        return ClientSettings(
            service_url=service_url,
            token=self.get_str("authToken"),
            tls_ca_file=self.get_str("tlsTrustCertsFilePath"),
            tls_cert_file=self.get_str("tlsCertificateFilePath"),
            tls_key_file=self.get_str("tlsKeyFilePath"),
            tls_allow_insecure=self.get_bool("tlsAllowInsecureConnection"),
            operation_timeout_s=self.get_int("operationTimeoutSeconds", 30, minimum=1) or 30,
        )

    def admin(self, cluster: str, *, required: bool) -> AdminSettings | None:
        """The admin client settings (adminUrl, adminToken, adminTls*, adminTimeoutMs...)."""
        urls = self.get_str("adminUrl", required=required)
        if urls is None:
            return None
        timeout_ms = self.get_int("adminTimeoutMs", 10_000, minimum=1)
        assert timeout_ms is not None
        try:
            return AdminSettings.from_urls(
                urls,
                cluster=cluster,
                token=self.get_str("adminToken"),
                tls_ca_file=self.get_str("adminTlsCaFile"),
                tls_cert_file=self.get_str("adminTlsCertFile"),
                tls_key_file=self.get_str("adminTlsKeyFile"),
                tls_allow_insecure=self.get_bool("adminTlsInsecure"),
                timeout_s=timeout_ms / 1000.0,
                attempts=self.get_int("adminAttempts", 4, minimum=1) or 4,
            )
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"option adminUrl: {e}") from e


def client_options(settings: ClientSettings) -> dict[str, str]:
    """The options :meth:`Options.client` reads back into ``settings`` (service URL aside)."""
    opts = {"serviceUrl": settings.service_url,
            "operationTimeoutSeconds": str(settings.operation_timeout_s)}
    optional = {"authToken": settings.token,
                "tlsTrustCertsFilePath": settings.tls_ca_file,
                "tlsCertificateFilePath": settings.tls_cert_file,
                "tlsKeyFilePath": settings.tls_key_file}
    opts |= {k: v for k, v in optional.items() if v}
    if settings.tls_allow_insecure:
        opts["tlsAllowInsecureConnection"] = "true"
    return opts


def admin_options(config: AdminSettings) -> dict[str, str]:
    """The options :meth:`Options.admin` reads back into ``config``."""
    opts = {"adminUrl": ",".join(config.urls),
            "adminTimeoutMs": str(max(1, round(config.timeout_s * 1000))),
            "adminAttempts": str(config.attempts)}
    optional = {"adminToken": config.token,
                "adminTlsCaFile": config.tls_ca_file,
                "adminTlsCertFile": config.tls_cert_file,
                "adminTlsKeyFile": config.tls_key_file}
    opts |= {k: v for k, v in optional.items() if v}
    if config.tls_allow_insecure:
        opts["adminTlsInsecure"] = "true"
    return opts
