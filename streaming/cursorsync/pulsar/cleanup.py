"""Finding and deleting subscriptions by name through the admin API, for retiring a job.

Deletion is never forced: the broker refuses to delete a subscription that has a consumer
connected (HTTP 412), so a job still running keeps what it reads on. Deleting a
subscription deletes its cursor only; the topic and its messages stay.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from urllib.parse import quote

import httpx

from cursorsync.errors import AdminError, AdminUnavailableError, TopicNotFoundError
from cursorsync.pulsar.admin import AdminAuthError, AdminClient
from cursorsync.pulsar.topics import TopicName


class SubscriptionBusyError(AdminError):
    """A subscription to delete has a consumer connected; names it and the topic."""


def subscriptions_of(admin: AdminClient, topics: Iterable[str | TopicName],
                     names: Iterable[str]) -> dict[str, list[str]]:
    """Which of ``names`` each topic partition has, by the partition's full name (a topic
    that does not exist on this cluster has none); one ``stats`` request per partition."""
    wanted = set(names)

    def found(topic: TopicName) -> list[str]:
        try:
            doc = admin.topic_stats(topic)
        except TopicNotFoundError:
            return []
        subs = doc.get("subscriptions") if isinstance(doc, dict) else None
        return sorted(n for n in (subs or {}) if n in wanted)

    return {t: subs for t, subs in admin.map_concurrently(found, topics).items() if subs}


def delete_subscription(admin: AdminClient, topic: str | TopicName, subscription: str) -> bool:
    """Delete ``subscription`` on one topic partition; False when it is not there.

    Raises :class:`SubscriptionBusyError` while a consumer is connected to it."""
    t = TopicName.parse(str(topic))
    where = f"subscription {subscription!r} on {t} (cluster {admin.cluster})"
    path = t.admin_path("subscription/" + quote(subscription, safe=""))
    failures: list[str] = []
    for attempt in range(admin.config.attempts):
        if attempt:
            time.sleep(min(admin.config.backoff_max_s,
                           admin.config.backoff_initial_s * 2 ** (attempt - 1)))
        for base in admin.config.urls:
            try:
                resp = admin._http.delete(base + path)  # its auth and TLS
            except httpx.TransportError as err:
                failures.append(f"{base}: {err!r}")
                continue
            if resp.status_code < 300:
                return True
            if resp.status_code == 404:
                return False
            if resp.status_code == 412:
                raise SubscriptionBusyError(
                    f"{where} has a consumer connected ({resp.text[:200]!r}); stop what "
                    "consumes it first")
            if resp.status_code in (401, 403):
                raise AdminAuthError(f"deleting {where} refused: HTTP {resp.status_code} "
                                     "(check the admin token and the role's permissions)")
            if resp.status_code < 500:
                raise AdminError(f"deleting {where} failed: HTTP {resp.status_code} "
                                 f"{resp.text[:200]!r}")
            failures.append(f"{base}: HTTP {resp.status_code} {resp.text[:200]!r}")
    raise AdminUnavailableError(f"deleting {where} failed: {'; '.join(failures)}")


__all__ = ["SubscriptionBusyError", "delete_subscription", "subscriptions_of"]
