"""Spark Python data sources: ``pulsar-entries`` (messages) and ``pulsar-cursors`` (cursor states).

Register both with :func:`register`, then ``spark.readStream.format(name)``.
"""

from typing import Any

from cursorsync.mapping.entries import PulsarEntriesDataSource
from cursorsync.mapping.entries_options import EntriesOptions
from cursorsync.sync.cursors import CursorsOptions, PulsarCursorsDataSource


def register(spark: Any) -> None:
    """Register both data sources on a SparkSession."""
    spark.dataSource.register(PulsarEntriesDataSource)
    spark.dataSource.register(PulsarCursorsDataSource)


__all__ = [
    "CursorsOptions",
    "EntriesOptions",
    "PulsarCursorsDataSource",
    "PulsarEntriesDataSource",
    "register",
]
