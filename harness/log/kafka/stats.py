"""Counters of one Kafka session log (``KafkaLog.stats``), safe to bump from any thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

__all__ = ["KafkaLogStats"]


@dataclass
class KafkaLogStats:
    """What a :class:`~harness.log.kafka.KafkaLog` did since it was opened.

    ``appends / transactions`` is the group-commit factor: how many ``append`` calls
    one transaction carried on average.
    """

    appends: int = 0  # SessionWriter.append calls committed
    records: int = 0  # records committed by those appends
    transactions: int = 0  # transactions committed
    aborts: int = 0  # transactions aborted and retried (txn_requires_abort)
    retries: int = 0  # retriable errors retried in place
    fenced: int = 0  # times a partition writer found itself fenced
    too_large: int = 0  # appends refused as too large
    submits: int = 0  # inputs produced by submit()
    corrupt: int = 0  # undecodable records met by reads (each read counts again)
    dead_lettered: int = 0  # poison records copied to the dead-letter topic (once each)
    producers_started: int = 0  # owner producers started (each ran init_transactions)
    reads: int = 0  # bounded reads of a partition (read, read_partition, scan, catch-up)
    reads_from_tail: int = 0  # whole-history reads answered by the index a shared tail taught (no fetch)
    tails_opened: int = 0  # shared tailing consumers the fan-out opened (one per partition followed)
    catch_up_reads: int = 0  # bounded reads of subscribers that started behind the shared tail
    tail_decoded: int = 0  # records a shared tail decoded for its subscribers
    tail_own: int = 0  # records this process committed, handed out by a shared tail without decoding
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        """The counters as a plain dict (a consistent copy)."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
