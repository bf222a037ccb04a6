"""cursorsync: carry Pulsar subscription progress across geo-replicated clusters.

The public surface of the pure core; the Spark job, tables and I/O live in
their own modules and are imported where used (they pull in heavy deps).
"""

from cursorsync.core.cursor import AckPlan, CursorState, fold
from cursorsync.core.guard import check_safe
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import MIN_POSITION, MessageId, Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping, holes
from cursorsync.core.translate import safe_target_acks, translate
from cursorsync.errors import (
    AdminError,
    ConfigError,
    CursorSyncError,
    MappingConflictError,
    PositionFormatError,
    TopicNotFoundError,
)

__version__ = "0.1.0"

__all__ = [
    "MIN_POSITION",
    "AckPlan",
    "AdminError",
    "ConfigError",
    "CursorState",
    "CursorSyncError",
    "Ledgers",
    "MappingConflictError",
    "MessageId",
    "Position",
    "PositionFormatError",
    "RangeSet",
    "Runs",
    "Segment",
    "SegmentSet",
    "TopicMapping",
    "TopicNotFoundError",
    "check_safe",
    "fold",
    "holes",
    "safe_target_acks",
    "translate",
]
