"""Stable identifiers.

Every format here is part of the on-the-wire and on-the-provider contract:
idempotency keys reach payment providers, topic names and transactional ids
reach Kafka clusters. NEVER change one of these formats: a changed idempotency
key makes a provider charge twice, a changed transactional id stops fencing the
previous owner.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container
from typing import Any

from harness.errors import InvalidId
from harness.words import with_article

MAX_ID = 512
"""The longest session or input id (a tenant's session id in the gateway: less its log prefix,
see :func:`session_id_problem`)."""


def id_problem(value: Any, kind: str) -> str | None:
    """What makes ``value`` unusable as a ``kind`` (the rules of :func:`check_id`), or None."""
    if not isinstance(value, str):
        return f"{with_article(kind)} must be a string, not {type(value).__name__}"
    if not value:
        return f"{with_article(kind)} must not be empty"
    if len(value) > MAX_ID:
        return f"{with_article(kind)} may be at most {MAX_ID} characters, not {len(value)}"
    if value != value.strip() or not value.isprintable():
        return (
            f"{kind} {value[:60]!r} holds a space at an end or a character that cannot be printed "
            "(a newline, a control character): ids are log keys, table cells and command arguments"
        )
    return None


def check_id(value: Any, kind: str) -> str:
    """``value`` if it is a usable session or input id (``kind`` names it in the error).

    Raises:
        InvalidId: not a string, empty, over ``MAX_ID`` characters, a space at either end,
            or a character that cannot be printed (newlines, control characters).
    """
    problem = id_problem(value, kind)
    if problem is not None:
        raise InvalidId(problem, kind=kind)
    return str(value)


def model_call_id(given: Any, where: str, taken: Container[str]) -> str:
    """The id a tool call of a model is logged and answered under: ``given`` when it is a
    usable id (:func:`check_id`'s rules) not in ``taken``.

    A model's id that is not usable (empty, not a string, a newline or another character
    that cannot be printed, a space at an end, longer than ``MAX_ID``) becomes
    ``call-<where>``; one already ``taken`` (ids are unique in a session) gets
    ``~<where>`` at its end. ``where`` says where the call is (``<turn>.<model call>.<position>``
    in a session), so the id is new. The logged response holds this id: replay, the
    tool result sent back to the model and ``harness answer`` all use it, never the model's.
    """
    call_id = given if id_problem(given, "tool call id") is None else f"call-{where}"
    if call_id in taken:
        call_id = f"{call_id[:MAX_ID - len(where) - 1]}~{where}"
    return str(call_id)


RESERVED_INPUT_PREFIXES = ("answer:", "cancel:")
"""The ids of answers (``answer:<call>:<name>:<digest>``) and cancels (``cancel:<input>``) by default."""


def answer_input_id(tool_call_id: str, name: str, value: Any) -> str:
    """The input id of an answer sent without one: ``answer:<call>:<ask>:<digest of the value>``.

    The same answer sent again has the same id (one input, one receipt); another value
    has another id, so an answer the session's owner refused (it fails the ask's model)
    can be corrected, and a second answer to an answered ask is refused as
    ``already_answered``, not as a reuse of an id its sender never chose. ``value`` is
    the answer's JSON copy. (An id over ``MAX_ID`` hashes the call and the ask too.)
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    input_id = f"answer:{tool_call_id}:{name}:{digest}"
    if len(input_id) > MAX_ID or not input_id.isprintable():
        where = hashlib.sha256(f"{tool_call_id}\0{name}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
        input_id = f"answer:{where}:{digest}"
    return input_id


def check_sent_input_id(value: Any) -> str:
    """``value`` if it can be the id of a message or of app records: an id (:func:`check_id`)
    that does not start like an answer's or a cancel's default id.

    A message sent as ``cancel:in-1`` would take the id of the cancel of ``in-1``: that
    cancel would then be refused as a resend with another payload, for good.

    Raises:
        InvalidId: as :func:`check_id`, or the id starts with a reserved prefix.
    """
    checked = check_id(value, "input id")
    if checked.startswith(RESERVED_INPUT_PREFIXES):
        raise InvalidId(
            f"input id {checked[:60]!r} starts with {checked.split(':', 1)[0] + ':'!r}, which is kept for the ids "
            "of answers and cancels: use another input id",
            kind="input id",
        )
    return checked


def session_id_problem(session_id: Any, tenant: str | None = None) -> str | None:
    """What makes ``session_id`` unusable as ``tenant``'s session id, or None.

    The one rule of session ids, for the library, the CLI and the gateway alike:
    :func:`check_id`'s, applied to the log's id of the session. With a tenant that is
    ``t/<tenant>/<id>`` (:func:`tenant_session_id`), so a tenant's ids are shorter by that
    prefix; the message then names the caller's id and its own limit.
    """
    problem = id_problem(session_id, "session id")
    if problem is None and tenant is not None:
        room = MAX_ID - len(tenant_session_id(tenant, ""))
        if len(session_id) > room:
            problem = (f"a session id of this tenant may be at most {room} characters, not {len(session_id)} "
                       f"(the log's id, t/<tenant>/<id>, may be at most {MAX_ID})")
    return problem


def log_id(namespace: str, session_id: str) -> str:
    """The id of one session's log: ``<namespace>/<session id>``.

    ``namespace`` is the log's own stable id (the topic prefix on Kafka, a
    random id made when a SQLite file is created), so two logs holding a
    session of the same name never share keys.
    """
    return f"{namespace}/{session_id}"


def idempotency_key(log_id_: str, tool_call_id: str, step_name: str) -> str:
    """``<log id>:<tool call id>:<step name>`` (SPEC 2.4). No attempt part, ever.

    ``step_name`` is the name as the log holds it, plain text (``_Names.take``). Up to
    release 0.1's stop 40 a ``(str, Enum)`` member given as a name went in as its
    ``format()`` (``Step.CHARGE``, the log holding ``charge``): a step of that kind cut
    between its fn and its commit by a crash, and run again after an upgrade past that
    fix, gets the key of the logged name.
    """
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


def live_topic(prefix: str) -> str:
    """``<prefix>.live``: text deltas of streamed model answers (short retention, not the log)."""
    return f"{prefix}.live"


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


TENANT_SESSION_PREFIX = "t/"
"""Start of a tenant-scoped session id in the log (see :func:`tenant_session_id`)."""


def tenant_session_id(tenant: str | None, session_id: str) -> str:
    """The log's session id of ``session_id`` as seen by ``tenant``: ``t/<tenant>/<session id>``.

    The tenant is percent-encoded (``urllib.parse.quote(tenant, safe="")``), so it
    never holds a ``/`` and the id splits at the second ``/``: the mapping is
    one-to-one whatever the session id holds (``team/alice`` too): two tenants may use
    the same session id, and the tenant that created a session is recorded in every
    record's key. With no tenant (``--open-access`` without a token, the CLI, the
    Python API) the log's id is the raw id, so every tool sees the same sessions in
    embedded mode; the gateway refuses such a caller an id of the form
    ``t/<tenant>/<id>``, which would be a tenant's session.
    """
    if tenant is None:
        return session_id
    from urllib.parse import quote

    return f"{TENANT_SESSION_PREFIX}{quote(tenant, safe='')}/{session_id}"


def split_tenant_session_id(log_session_id: str) -> tuple[str | None, str]:
    """``(tenant, session id)`` of a log's session id; the inverse of :func:`tenant_session_id`."""
    if log_session_id.startswith(TENANT_SESSION_PREFIX):
        tenant, sep, session_id = log_session_id[len(TENANT_SESSION_PREFIX):].partition("/")
        if sep and tenant and session_id:
            from urllib.parse import unquote

            return unquote(tenant), session_id
    return None, log_session_id


RECORD_CRC_HEADER = "harness.crc32"
"""Kafka header holding the CRC-32 (zlib/IEEE) of the message value, 4 bytes big-endian."""
