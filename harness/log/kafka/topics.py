"""Create the log's topics when missing (or check they exist); refuse a sessions topic of the
wrong shape; probe a cluster."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness.errors import LogUnavailable, TopicNotFound
from harness.log.kafka.config import ADMIN_TIMEOUT_S, KafkaSettings

__all__ = ["ClusterProbe", "ensure_topics", "probe"]

log = logging.getLogger("harness.log.kafka")

DEAD_LETTER_PARTITIONS = 1
"""Dead letters are rare and read by people and tools; one partition keeps them in order."""


def _topic_config(settings: KafkaSettings) -> dict[str, str]:
    config = {"cleanup.policy": "delete", "retention.ms": "-1"}
    if settings.min_insync_replicas is not None:
        config["min.insync.replicas"] = str(settings.min_insync_replicas)
    config.update(settings.topic_config)
    return config


def ensure_topics(
    settings: KafkaSettings, *, timeout: float = ADMIN_TIMEOUT_S, create: bool = True, adopt: bool = False
) -> int:
    """Create ``<prefix>.sessions`` and ``<prefix>.dead-letter`` if missing; validate them.

    Blocking (call it from a worker thread). Safe to race with other processes creating
    the same topics.

    Args:
        create: create missing topics; without it a missing sessions topic raises
            ``TopicNotFound`` (clients never create topics: workers do).
        adopt: take the sessions topic's partition count as it is instead of
            checking it against ``settings.partitions`` (which is then only the count
            of a topic created here).

    Returns:
        The sessions topic's partition count.

    Raises:
        TopicNotFound: ``create=False`` and the sessions topic does not exist.
        LogUnavailable: the cluster cannot be reached, refuses to create a topic, or the
            sessions topic exists with a partition count other than ``settings.partitions``
            (sessions would map to other partitions than every other client computes).
    """
    admin = AdminClient(settings.admin_config())
    wanted = {
        settings.sessions_topic: settings.partitions,
        settings.dead_letter_topic: DEAD_LETTER_PARTITIONS,
    }
    existing = _partition_counts(admin, timeout)
    if not create:
        if settings.sessions_topic not in existing:
            raise TopicNotFound(
                f"topic {settings.sessions_topic!r} does not exist on {settings.bootstrap}: start a worker "
                f"on this log (it creates its topics) or run `harness topics create --log URL`; "
                f"check the topic prefix ({settings.topic_prefix!r})",
                topic=settings.sessions_topic,
            )
        wanted = {settings.sessions_topic: settings.partitions}
    missing = [
        NewTopic(
            name,
            num_partitions=count,
            replication_factor=settings.replication_factor,
            config=_topic_config(settings),
        )
        for name, count in wanted.items()
        if name not in existing
    ]
    if missing:
        futures = admin.create_topics(missing, operation_timeout=timeout, request_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race: fine
                    raise LogUnavailable(f"cannot create topic {name!r}: {exc.args[0].str()}") from exc
                continue
            if name == settings.sessions_topic:  # (a typo in the prefix makes a new, empty log: said here)
                log.info("created topic %s on %s: a new, empty session log of %d partition(s); if you expected "
                         "sessions there, check the topic prefix %r", name, settings.bootstrap, wanted[name],
                         settings.topic_prefix)
            else:
                log.info("created topic %s on %s", name, settings.bootstrap)
    # Wait until every partition has a leader, so the first produce / assign does not
    # race topic creation; then validate what is really there.
    deadline = time.monotonic() + timeout
    while True:
        counts = _partition_counts(admin, timeout, leaders_only=True)
        if all(counts.get(name) is not None for name in wanted):
            break
        if time.monotonic() > deadline:
            raise LogUnavailable(f"topics {sorted(wanted)} have no leader after {timeout}s")
        time.sleep(0.05)
    actual = counts[settings.sessions_topic]
    assert actual is not None  # the loop above waited for it
    if actual != settings.partitions and not adopt:
        raise LogUnavailable(
            f"topic {settings.sessions_topic!r} has {actual} partitions but this log is configured "
            f"for {settings.partitions}: sessions would be looked up in the wrong partitions. "
            f"Open the log with partitions={actual} in its URL (`--partitions {actual}` for "
            "`harness topics create`; never repartition a sessions topic)."
        )
    if create:
        _warn_if_it_forgets(admin, settings, timeout)
    return actual


_KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}
"""What a sessions topic must keep: every record (a session's history is its state)."""


def _warn_if_it_forgets(admin: Any, settings: KafkaSettings, timeout: float) -> None:
    """Warn when the sessions topic (made by someone else, e.g. with the broker's default of
    7 days) deletes old records: a session's older records, and with them its history and
    what a rebuild without a checkpoint needs, would go. A retention asked for in the log's
    own topic settings is taken as meant."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    resource = ConfigResource(ResourceType.TOPIC, settings.sessions_topic)
    try:
        found = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - no right to describe it (ACLs): nothing to say
        log.debug("could not read the settings of topic %s: %s", settings.sessions_topic, exc)
        return
    wrong = {
        name: found[name].value
        for name, keep in _KEEP_FOREVER.items()
        if name in found and found[name].value != keep and name not in settings.topic_config
    }
    if wrong:
        shown = ", ".join(f"{name}={value}" for name, value in sorted(wrong.items()))
        fix = ",".join(f"{name}=-1" for name in sorted(wrong))
        log.warning("topic %s deletes old records (%s): sessions lose their history past that; keep every record: "
                    "kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config %s",
                    settings.sessions_topic, shown, settings.sessions_topic, fix)


class ClusterProbe:
    """Asks the cluster for the sessions topic's metadata, again and again, through one
    admin client (for readiness checks: a fresh client per check would connect anew)."""

    def __init__(self, settings: KafkaSettings) -> None:
        config = dict(settings.admin_config())
        config.pop("logger", None)
        config["log_level"] = 0  # (its connect failures are what the raised error says)
        self._admin = AdminClient(config)
        self._settings = settings
        self._lock = threading.Lock()

    def check(self, timeout: float) -> None:
        """Raises ``LogUnavailable`` unless the cluster answers within ``timeout`` seconds
        and the sessions topic exists (blocking)."""
        topic = self._settings.sessions_topic
        with self._lock:
            try:
                meta = self._admin.list_topics(topic, timeout=timeout)
            except KafkaException as exc:
                raise LogUnavailable(
                    f"the Kafka cluster at {self._settings.bootstrap} did not answer within {timeout:g} s "
                    f"({exc.args[0].str()})"
                ) from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            raise LogUnavailable(f"the topic {topic!r} is not there any more (deleted?)")


def probe(settings: KafkaSettings, *, timeout: float) -> None:
    """Check within ``timeout`` seconds that the cluster answers a metadata request.

    The Kafka client's own log lines are silenced here: an unreachable broker makes it
    report every failed connection, and the one error raised says it all.

    Raises:
        ValueError: the client settings are refused (an unknown librdkafka property ...).
        LogUnavailable: no broker answered in time.
    """
    config = dict(settings.admin_config())
    config.pop("logger", None)
    config["log_level"] = 0
    try:
        admin = AdminClient(config)
    except KafkaException as exc:
        raise ValueError(f"the Kafka client refused its settings: {exc.args[0].str()}") from exc
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise LogUnavailable(
            f"cannot reach Kafka at {settings.bootstrap} within {timeout:g} s ({exc.args[0].str()}): "
            f"check the address in --log (or HARNESS_LOG) and that the broker is up{security_hint(settings)}"
        ) from exc


def security_hint(settings: KafkaSettings) -> str:
    """What to check when a broker that is up does not answer: the client's security
    protocol against the broker's listener (never a credential: only the protocol's name)."""
    protocol = str(settings.client_config.get("security.protocol") or "plaintext")
    if protocol.lower() == "plaintext":
        return " (and, if its listener needs TLS or SASL, set security.protocol: HARNESS_KAFKA_CONFIG_SECURITY_PROTOCOL)"
    return f", and that its listener at that address speaks security.protocol {protocol!r}, as this client does"


def _partition_counts(
    admin: AdminClient, timeout: float, *, leaders_only: bool = False
) -> dict[str, int | None]:
    """Partition count per topic; with ``leaders_only`` None while a partition has no leader."""
    try:
        metadata: Any = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise LogUnavailable(f"Kafka cluster unreachable: {exc.args[0].str()}") from exc
    out: dict[str, int | None] = {}
    for name, topic in metadata.topics.items():
        if topic.error is not None:
            out[name] = None
            continue
        partitions = topic.partitions.values()
        ready = not leaders_only or all(p.leader >= 0 and p.error is None for p in partitions)
        out[name] = len(partitions) if ready and partitions else None
    return out
