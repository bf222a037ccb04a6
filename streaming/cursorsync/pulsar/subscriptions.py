"""Pulsar subscription types, and which of them take cumulative acks."""

from __future__ import annotations

from typing import Literal, get_args

SubscriptionType = Literal["Exclusive", "Failover", "Shared", "Key_Shared"]
SUBSCRIPTION_TYPES: tuple[SubscriptionType, ...] = get_args(SubscriptionType)
#: The broker accepts cumulative acks on these only.
CUMULATIVE_TYPES: frozenset[str] = frozenset({"Exclusive", "Failover"})
