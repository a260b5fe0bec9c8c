"""Settings of the Kafka session log: URL parsing, client configs, timeouts, error verdicts.

Every timeout the Kafka backend uses is a named constant here, next to why it has its
value. Relations that must hold (checked in :class:`KafkaSettings`):

* ``message.timeout.ms <= transaction.timeout.ms`` (librdkafka refuses otherwise): a
  record still undelivered when its transaction would time out is useless.
* ``commit deadline <= transaction.timeout.ms``: retrying a commit past the moment the
  coordinator aborts the transaction itself only hides the failure.
* The writers use no consumer group, so ``max.poll.interval.ms`` and
  ``session.timeout.ms`` do not bound them; the worker service that joins the
  ``<prefix>.workers`` group must keep ``max.poll.interval.ms`` well above
  ``transaction.timeout.ms`` so a slow transaction never costs it its partitions.
"""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from harness.errors import LogConfigError
from harness.ids import dead_letter_topic, owner_transactional_id, sessions_topic
from harness.log.kafka.client_log import client_log

__all__ = [
    "COMMIT_DEADLINE_S",
    "GROUP_COMMIT_LINGER_S",
    "DEFAULT_PARTITIONS",
    "INIT_TIMEOUT_S",
    "PREVIOUS_CLOSE_TIMEOUT_S",
    "MAX_ABORT_RETRIES",
    "MAX_APPENDS_PER_TRANSACTION",
    "READ_TIMEOUT_S",
    "TRANSACTION_TIMEOUT_MS",
    "KafkaSettings",
    "Verdict",
    "classify",
    "parse_kafka_url",
]

DEFAULT_PARTITIONS = 12
"""Partitions of a sessions topic created without a count (a topic that exists keeps its own)."""

TRANSACTION_TIMEOUT_MS = 10_000
"""``transaction.timeout.ms`` of every owner producer.

A writer killed inside a transaction leaves it open, and an open transaction pins the
partition's last stable offset: read_committed readers of that partition (every other
session in it, too) see nothing past it. It ends either at once, when the next owner's
``init_transactions`` with the same ``transactional.id`` fences the dead writer and
aborts it, or, when no owner takes over, after this timeout (plus up to the broker's
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default).
Short, so a dead writer stalls readers for seconds, not the 60 s librdkafka default;
long enough for any one group-commit transaction (milliseconds in practice)."""

MESSAGE_TIMEOUT_MS = TRANSACTION_TIMEOUT_MS
"""``message.timeout.ms``: a record not acknowledged within its transaction's lifetime fails."""

COMMIT_DEADLINE_S = TRANSACTION_TIMEOUT_MS / 1000
"""How long one group commit keeps retrying retriable errors before failing its appends."""

INIT_TIMEOUT_S = 30.0
"""``init_transactions`` timeout. It may wait for the coordinator to abort the previous
owner's open transaction (``CONCURRENT_TRANSACTIONS`` retries), bounded by
``TRANSACTION_TIMEOUT_MS``, so it is well above that."""

PREVIOUS_CLOSE_TIMEOUT_S = 30.0
"""How long a partition's new owner writer waits for the previous one of this process to
close (its queued appends finish first) before starting anyway: a producer whose close
hangs (librdkafka aborting a transaction the broker lost during a restart) must not stall
the partition; the new producer's init_transactions fences it at the broker."""

READ_TIMEOUT_S = 30.0
"""A bounded read that cannot reach the partition's end in this time fails with
``LogUnavailable`` (a broker down), instead of hanging."""

ADMIN_TIMEOUT_S = 30.0
"""Creating / describing topics."""

SUBMIT_TIMEOUT_S = MESSAGE_TIMEOUT_MS / 1000 + 5
"""A submit waits for its delivery report; librdkafka reports failure by ``message.timeout.ms``."""

MAX_ABORT_RETRIES = 5
"""Abortable errors (``txn_requires_abort``) retried per group commit before giving up."""

MAX_APPENDS_PER_TRANSACTION = 1000
"""Cap of one group commit, so a burst cannot make one transaction arbitrarily long."""

GROUP_COMMIT_LINGER_S = 0.004
"""Longest a transaction waits for the sessions of the previous one to come back with
their next append, when several sessions of the partition are active (a lone session
never waits) and only for sessions with more to write (not those whose input just
settled). Each transaction costs the broker about the same whatever it carries
(~1.5-2.5 ms of CPU on the 2-core bench machine), so under load fuller transactions are
what lets more turns through; a busy owner needs a few ms to come back."""

# librdkafka settings the backend's guarantees rest on: a user's client_config may not set them.
_RESERVED = frozenset(
    {
        "transactional.id",
        "enable.idempotence",
        "isolation.level",
        "acks",
        "request.required.acks",
        "enable.auto.commit",
        "enable.partition.eof",
        "auto.offset.reset",
        "partitioner",
    }
)

MAX_PARTITIONS = 100_000
"""The most partitions librdkafka creates a topic with (``RD_KAFKAP_PARTITIONS_MAX``)."""
MAX_REPLICATION_FACTOR = 10_000
"""The largest replication factor librdkafka creates a topic with (``RD_KAFKAP_BROKERS_MAX``)."""

_URL_INT_OPTIONS = ("partitions", "replication_factor", "min_insync_replicas")
_URL_OPTIONS = ("topic_prefix", "registry_url", *_URL_INT_OPTIONS)


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Where the log lives and how its clients are configured (immutable).

    ``client_config`` holds librdkafka settings (security, timeouts ...) passed to every
    client this log creates; it is copied on construction and never mutated.
    """

    bootstrap: str
    topic_prefix: str = "harness"
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = 1
    min_insync_replicas: int | None = None
    topic_config: Mapping[str, str] = field(default_factory=dict)
    client_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise LogConfigError("bootstrap is required (host:port[,host:port])")
        if not self.topic_prefix or any(c not in _TOPIC_CHARS for c in self.topic_prefix):
            raise LogConfigError(f"topic_prefix {self.topic_prefix!r} must use only [a-zA-Z0-9._-]")
        if self.partitions < 1 or self.replication_factor < 1:
            raise LogConfigError("partitions and replication_factor must be >= 1")
        # librdkafka's limits: a larger count failed inside the client when the topics were
        # created ("OverflowError: signed integer is greater than maximum", "out of expected range").
        if self.partitions > MAX_PARTITIONS:
            raise LogConfigError(f"partitions must be from 1 to {MAX_PARTITIONS}, not {self.partitions}")
        if self.replication_factor > MAX_REPLICATION_FACTOR:
            raise LogConfigError(
                f"replication_factor must be from 1 to {MAX_REPLICATION_FACTOR}, not {self.replication_factor}"
            )
        if (
            self.min_insync_replicas is not None
            and not 1 <= self.min_insync_replicas <= self.replication_factor
        ):
            raise LogConfigError("min_insync_replicas must be between 1 and replication_factor")
        reserved = sorted(_RESERVED & set(self.client_config))
        if reserved:
            raise LogConfigError(
                f"client_config may not set {', '.join(reserved)}: the session log's guarantees rest on them"
            )
        object.__setattr__(self, "client_config", MappingProxyType(dict(self.client_config)))
        object.__setattr__(self, "topic_config", MappingProxyType(dict(self.topic_config)))

    # --- names ------------------------------------------------------------------------

    @property
    def sessions_topic(self) -> str:
        return sessions_topic(self.topic_prefix)

    @property
    def dead_letter_topic(self) -> str:
        return dead_letter_topic(self.topic_prefix)

    # --- client configs (fresh dicts: librdkafka clients get their own copy) ----------

    def _base(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "socket.nagle.disable": True,
            # librdkafka's own log lines go to Python logging (throttled), not to stderr.
            "logger": client_log,
            **self.client_config,
        }

    def admin_config(self) -> dict[str, Any]:
        return self._base()

    def owner_producer_config(self, partition: int) -> dict[str, Any]:
        """The fenced, transactional producer of one owned partition."""
        return {
            "linger.ms": 0,  # a group commit produces then flushes at once; nothing to wait for
            "retry.backoff.ms": 10,
            "retry.backoff.max.ms": 100,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            **self._base(),
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "transactional.id": owner_transactional_id(self.topic_prefix, partition),
            "enable.idempotence": True,
            "acks": "all",
        }

    def input_producer_config(self) -> dict[str, Any]:
        """The idempotent, non-transactional producer of submitted inputs and dead letters."""
        return {
            "linger.ms": 0,
            "retry.backoff.ms": 10,
            "retry.backoff.max.ms": 100,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            **self._base(),
            "enable.idempotence": True,
            "acks": "all",
        }

    def reader_config(self, *, tail: bool = False) -> dict[str, Any]:
        """A read_committed consumer used with ``assign()`` only: it never joins a group."""
        return {
            # A bounded read ends at the EOF event, which librdkafka raises only on the
            # (empty) fetch AFTER the one that returned the last records: the broker holds
            # that fetch for fetch.wait.max.ms, so every read would pay it (500 ms by
            # default). 1 ms makes a read cost a few ms; it only spins while a read runs.
            # A tail waits longer per fetch so an idle partition does not spin.
            "fetch.wait.max.ms": 100 if tail else 1,
            **self._base(),
            # librdkafka requires a group.id even for assign(); it is never joined or committed.
            "group.id": f"{self.topic_prefix}.readers",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Verify Kafka's own batch CRCs (broker disk): each record's harness.crc32
            # header is verified by the reader too (harness.log.kafka.checksum).
            "check.crcs": True,
            # A start offset past the log's end is clamped before assign(); anything else
            # out of range is an error, never a silent jump to another position.
            "auto.offset.reset": "error",
        }


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def parse_kafka_url(url: str) -> dict[str, Any]:
    """``kafka://host:port[,host:port]?topic_prefix=&partitions=&replication_factor=&
    min_insync_replicas=&registry_url=`` as keyword arguments of ``KafkaLog``.

    Raises:
        ValueError: not a kafka URL, no host, or an unknown / malformed option.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "kafka":
        raise LogConfigError(f"not a kafka:// URL: {url!r}")
    if not parts.netloc or parts.path not in ("", "/") or parts.fragment:
        raise LogConfigError(f"{url!r}: expected kafka://host:port[,host:port][?options]")
    if "@" in parts.netloc:  # (not echoed: it may hold a password)
        raise LogConfigError("a kafka:// URL holds no user or password: give them as HARNESS_KAFKA_CONFIG_SASL_USERNAME "
                         "and HARNESS_KAFKA_CONFIG_SASL_PASSWORD (the chart: kafka.sasl.existingSecret)")
    for server in parts.netloc.split(","):
        host, colon, port = server.rpartition(":")
        if not colon or not host:
            raise LogConfigError(f"{url!r}: {server!r} needs a port: kafka://{server or 'host'}:9092 (Kafka's usual one)")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise LogConfigError(f"{url!r}: {port!r} is not a port (1-65535) in {server!r}")
    out: dict[str, Any] = {"bootstrap": parts.netloc}
    for name, values in urllib.parse.parse_qs(
        parts.query, keep_blank_values=True, strict_parsing=False
    ).items():
        if name not in _URL_OPTIONS:
            raise LogConfigError(f"{url!r}: unknown option {name!r}; known: {', '.join(_URL_OPTIONS)}")
        if len(values) != 1 or not values[0]:
            raise LogConfigError(f"{url!r}: option {name!r} needs exactly one non-empty value")
        value: Any = values[0]
        if name in _URL_INT_OPTIONS:
            try:
                value = int(value)
            except ValueError:
                raise LogConfigError(f"{url!r}: option {name!r} must be an integer, not {value!r}") from None
        out[name] = value
    return out


# --- error verdicts --------------------------------------------------------------------


class Verdict(enum.Enum):
    """What to do about a ``KafkaError`` raised by a transactional producer call."""

    FENCED = "fenced"  # another owner took the partition (or the producer is dead): stop
    ABORT = "abort"  # abort the transaction and retry the batch in a new one
    RETRY = "retry"  # call the same operation again
    FAIL = "fail"  # give up this batch


def classify(error: Any) -> Verdict:
    """The verdict for a ``confluent_kafka.KafkaError`` (order matters: fatal first).

    ``_FENCED``/``PRODUCER_FENCED``/``INVALID_PRODUCER_EPOCH`` or any ``fatal()`` error
    means this producer can never write again; librdkafka raises fencing as fatal, the
    explicit codes cover brokers and client paths that report it otherwise.
    """
    from confluent_kafka import KafkaError

    fenced = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FATAL}
    if error.fatal() or error.code() in fenced:
        return Verdict.FENCED
    if error.txn_requires_abort():
        return Verdict.ABORT
    if error.retriable():
        return Verdict.RETRY
    return Verdict.FAIL
