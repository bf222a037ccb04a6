"""How to reach the two clusters: URLs, credentials, TLS, timeouts."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, field_validator, model_validator

from cursorsync.app.settings.base import (
    _ADMIN_SCHEMES,
    _SERVICE_SCHEMES,
    EMBEDDED,
    _invalid,
    _Section,
)
from cursorsync.errors import ConfigError


class TlsConfig(_Section):
    """TLS towards the broker and the admin API; cert_file + key_file = mutual TLS auth."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    allow_insecure: bool = False

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise _invalid("cert_file and key_file must be given together (mutual TLS)")
        return self

    def check_files(self, cluster: str) -> None:
        """Fail naming the key and the file when a TLS file cannot be read or holds no PEM
        certificate (or key): the TLS libraries say only "No such file or directory", or
        the Pulsar client "AuthenticationError". Read when a connection is configured, not
        when the config is, so commands that reach no cluster need no certificates."""
        where = f"cluster {cluster}: auth.tls"
        for key, path in (("ca_file", self.ca_file), ("cert_file", self.cert_file),
                          ("key_file", self.key_file)):
            if path is not None:
                _readable(f"{where}.{key}", path)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"{where}.ca_file: {self.ca_file!r} holds no PEM certificate "
                              f"({exc})") from None
        try:
            if self.cert_file is not None and self.key_file is not None:
                # No password: neither client takes one, and OpenSSL would ask the
                # terminal for an encrypted key's.
                context.load_cert_chain(self.cert_file, self.key_file, password=b"")
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"{where}.cert_file, key_file: {self.cert_file!r} and {self.key_file!r} are "
                f"not a PEM certificate and its private key, unencrypted ({exc})") from None


def _readable(key: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc.strerror or exc}") from None


class AuthConfig(_Section):
    """Credentials: a token (inline or from a file), TLS, or TLS plus a token."""

    token: SecretStr | None = None
    token_file: str | None = None
    tls: TlsConfig | None = None

    @model_validator(mode="after")
    def _one_token_source(self) -> Self:
        if self.token is not None and self.token_file is not None:
            raise _invalid("give either token or token_file, not both")
        return self

    def resolve_token(self) -> str | None:
        """The bearer token, read from token_file at call time (so rotated tokens are seen)."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is not None:
            try:
                return Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    f"auth.token_file: cannot read {self.token_file!r}: {exc.strerror}"
                ) from exc
        return None


class ClusterConfig(_Section):
    """One Pulsar cluster: its binary-protocol service URL and its admin REST URL."""

    name: str = Field(min_length=1)
    service_url: str
    admin_url: str
    auth: AuthConfig = Field(default_factory=AuthConfig)
    request_timeout_s: float = Field(default=30.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1, le=1024)
    #: Messages a mapping reader may hold in its receiver queue (memory: this many
    #: messages per task).
    receiver_queue_size: int = Field(default=1000, ge=1, le=100_000)
    #: Mapping readers each Spark worker process keeps open between batches, one per
    #: partition whose last range was small (memory: up to 100 messages each).
    kept_readers: int = Field(default=2048, ge=0, le=100_000)

    @field_validator("service_url")
    @classmethod
    def _service_url(cls, value: str) -> str:
        if value != EMBEDDED and not value.startswith(_SERVICE_SCHEMES):
            raise _invalid(
                f"{value!r} is not a valid service URL. Valid forms are: "
                f"pulsar://host:port, pulsar+ssl://host:port, {EMBEDDED}"
            )
        return value

    @field_validator("admin_url")
    @classmethod
    def _admin_url(cls, value: str) -> str:
        if value != EMBEDDED and not value.startswith(_ADMIN_SCHEMES):
            raise _invalid(
                f"{value!r} is not a valid admin URL. Valid forms are: "
                f"http://host:port, https://host:port, {EMBEDDED}"
            )
        return value.rstrip("/") if value != EMBEDDED else value

    @property
    def is_embedded(self) -> bool:
        """True while a URL still waits for the test bed to fill it in."""
        return EMBEDDED in (self.service_url, self.admin_url)


class ClustersConfig(_Section):
    """The two clusters: acks are read on source and written on target."""

    source: ClusterConfig
    target: ClusterConfig

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if self.source.name == self.target.name:
            raise _invalid(
                f"source and target have the same name {self.source.name!r}; "
                "they must be the two different clusters of the replication"
            )
        return self
