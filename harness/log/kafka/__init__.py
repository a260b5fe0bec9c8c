"""The Kafka session log backend (``kafka://host:port?topic_prefix=...``).

One module per job:

* ``log``            ``KafkaLog``: the ``SessionLog`` on a partitioned topic; ``open_kafka_log``
* ``config``         URL parsing, client configs, every timeout and why, error verdicts
* ``partitioner``    Kafka's murmur2 keyed partitioner (any producer agrees on a session's partition)
* ``writer``         ``PartitionWriter``: one fenced transactional producer per owned partition,
                     group commit
* ``session_writer`` ``KafkaSessionWriter``: a session's view of its partition's writer
* ``owners``         ``Owners``: this process's owner writers (claims, epochs, owned partitions)
* ``inputs``         the idempotent input producer and the dead-letter topic
* ``reader``         bounded read_committed reads of a partition
* ``fanout``         ``Fanout``: one shared tailing consumer per process, fanned out by
                     partition and key to every subscriber (no gap, no duplicate)
* ``tail_consumer``  ``TailConsumer``: that consumer and its thread (assignment, batches)
* ``index``          ``PartitionIndex``: where a session's history starts (checkpoint + reads)
* ``snapshots``      partition checkpoints in the compacted ``<prefix>.snapshots`` topic
* ``topics``         creating and validating the topics
* ``stats``          counters

The names below load on first use, so importing a pure helper (``partitioner``,
``config``) does not import the Kafka client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from harness.log.kafka.inputs import DLQ_ERROR_HEADER as DLQ_ERROR_HEADER
    from harness.log.kafka.inputs import DLQ_OFFSET_HEADER as DLQ_OFFSET_HEADER
    from harness.log.kafka.inputs import DLQ_PARTITION_HEADER as DLQ_PARTITION_HEADER
    from harness.log.kafka.inputs import DLQ_TOPIC_HEADER as DLQ_TOPIC_HEADER
    from harness.log.kafka.log import KafkaLog as KafkaLog
    from harness.log.kafka.log import open_kafka_log as open_kafka_log
    from harness.log.kafka.session_writer import KafkaSessionWriter as KafkaSessionWriter
    from harness.log.kafka.stats import KafkaLogStats as KafkaLogStats
    from harness.log.kafka.writer import RecordTooLarge as RecordTooLarge

_EXPORTS = {
    "DLQ_ERROR_HEADER": "harness.log.kafka.inputs",
    "DLQ_OFFSET_HEADER": "harness.log.kafka.inputs",
    "DLQ_PARTITION_HEADER": "harness.log.kafka.inputs",
    "DLQ_TOPIC_HEADER": "harness.log.kafka.inputs",
    "KafkaLog": "harness.log.kafka.log",
    "KafkaLogStats": "harness.log.kafka.stats",
    "KafkaSessionWriter": "harness.log.kafka.session_writer",
    "RecordTooLarge": "harness.log.kafka.writer",
    "open_kafka_log": "harness.log.kafka.log",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.log.kafka' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
