"""``harness topics create``: the Kafka topics of a log, before any worker or client uses them.

Workers create missing topics themselves; clients (``HarnessClient``, the session
commands) never do. Creating them up front fixes the partition count once:
``<prefix>.sessions`` (the log), ``<prefix>.dead-letter`` (records nobody can decode)
and ``<prefix>.snapshots`` (partition checkpoints, compacted).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from harness.cli.common import CommandParser, add_log_option, log_url, open_log_for, whole_number
from harness.errors import ConfigError

__all__ = ["main_topics"]


def topics_parser() -> CommandParser:
    parser = CommandParser(
        prog="harness topics",
        description="Create the Kafka topics of a log (sessions, dead-letter, snapshots) if they are missing; "
        "an existing sessions topic keeps its partition count (a different --partitions is refused).",
        example="  harness topics create --log 'kafka://broker:9092?topic_prefix=acme' --partitions 12",
    )
    parser.add_argument("action", choices=("create",), help="what to do")
    add_log_option(parser)
    from harness.log.kafka.config import MAX_PARTITIONS  # (no librdkafka import: only numbers and names)

    parser.add_argument("--partitions", type=whole_number("--partitions takes", maximum=MAX_PARTITIONS), metavar="N",
                        help="partitions of a new sessions topic (default: the URL's, else 12)")
    return parser


def _existing(settings: Any) -> set[str]:
    from confluent_kafka.admin import AdminClient

    config = dict(settings.admin_config())
    return set(AdminClient(config).list_topics(timeout=30).topics)


async def main_topics(argv: list[str]) -> int:
    args = topics_parser().parse_args(argv)
    url = log_url(args.log, os.environ)
    if not url.startswith("kafka://"):
        raise ConfigError(
            f"{url!r} is not a Kafka log: only Kafka logs have topics (a SQLite file is created by "
            "the first worker or HarnessHost that opens it)",
            setting="--log",
        )
    from harness.log.kafka.config import parse_kafka_url

    try:
        given = parse_kafka_url(url).get("partitions")
    except ValueError as exc:
        raise ConfigError(str(exc), setting="--log") from exc
    if args.partitions is not None and given is not None and args.partitions != given:
        raise ConfigError(f"--partitions {args.partitions} contradicts partitions={given} in the log URL",
                          setting="--partitions")
    log: Any = await open_log_for(args.log, role="worker", partitions=args.partitions, start=False)
    try:
        settings = log.settings
        before = await asyncio.to_thread(_existing, settings)
        await log.start()  # creates sessions and dead-letter; refuses a sessions topic of another shape
        settings = log.settings
        await asyncio.to_thread(log.snapshots.ensure_topic)
        names = (settings.sessions_topic, settings.dead_letter_topic, log.snapshots.topic)
    finally:
        await log.close()
    for name in names:
        what = "exists" if name in before else "created"
        extra = "" if name == settings.dead_letter_topic else f", {settings.partitions} partitions"
        print(f"{name}: {what}{extra}")
    return 0
