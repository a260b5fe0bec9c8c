"""Stable identifiers.

Every format here is part of the on-the-wire and on-the-provider contract:
idempotency keys reach payment providers, topic names and transactional ids
reach Kafka clusters. NEVER change one of these formats: a changed idempotency
key makes a provider charge twice, a changed transactional id stops fencing the
previous owner.
"""

from __future__ import annotations


def log_id(namespace: str, session_id: str) -> str:
    """The id of one session's log: ``<namespace>/<session id>``.

    ``namespace`` is the log's own stable id (the topic prefix on Kafka, a
    random id made when a SQLite file is created), so two logs holding a
    session of the same name never share keys.
    """
    return f"{namespace}/{session_id}"


def idempotency_key(log_id_: str, tool_call_id: str, step_name: str) -> str:
    """``<log id>:<tool call id>:<step name>`` (SPEC 2.4). No attempt part, ever."""
    return f"{log_id_}:{tool_call_id}:{step_name}"


def plain_idempotency_key(chat_id: str, tool_call_id: str, step_name: str) -> str:
    """``plain:<chat id>:<tool call id>:<step name>``: a step of plain mode (``chat()``, SPEC 2.4).

    ``chat_id`` is new for every ``chat()`` call, so a model that reuses its call ids
    across conversations never makes two real charges share a key.
    """
    return f"plain:{chat_id}:{tool_call_id}:{step_name}"


def sessions_topic(prefix: str) -> str:
    return f"{prefix}.sessions"


def dead_letter_topic(prefix: str) -> str:
    return f"{prefix}.dead-letter"


def snapshots_topic(prefix: str) -> str:
    return f"{prefix}.snapshots"


def workers_group(prefix: str) -> str:
    return f"{prefix}.workers"


def owner_transactional_id(prefix: str, partition: int) -> str:
    """``<prefix>.owner.<partition>``: a new owner's init_transactions fences the old one."""
    return f"{prefix}.owner.{partition}"


def message_key(session_id: str) -> bytes:
    """Kafka message key: the session id, so a session lives in one partition, in order."""
    return session_id.encode("utf-8")


RECORD_TYPE_HEADER = "harness.type"
"""Kafka header that names the record type of a message value."""

RECORD_CRC_HEADER = "harness.crc32"
"""Kafka header holding the CRC-32 (zlib/IEEE) of the message value, 4 bytes big-endian."""
