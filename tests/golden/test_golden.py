"""Old records must still decode: every checked-in golden ``.bin`` against its ``.json``.

A schema change that cannot read these bytes fails here. Do not regenerate the
files to make it pass (see ``make_golden.py``); keep the change compatible instead.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.codec import decode
from harness.records import RECORD_CLASSES, RECORD_TYPES

HERE = Path(__file__).resolve().parent
BINS = sorted(HERE.glob("*.bin"))


def test_every_record_type_has_a_golden_vector() -> None:
    missing = [cls.TYPE for cls in RECORD_CLASSES if not (HERE / f"{cls.TYPE}.bin").is_file()]
    assert not missing, f"add golden vectors (python tests/golden/make_golden.py) for: {missing}"


@pytest.mark.parametrize("path", BINS, ids=[p.stem for p in BINS])
def test_golden_vector_decodes(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    record = decode(path.read_bytes())
    assert expected["type"] == record.TYPE
    got = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if "tool_calls" in got:
        got["tool_calls"] = list(got["tool_calls"])
    # A field added to the schema after these bytes were written decodes to its default.
    added = {f.name: f.default for f in dataclasses.fields(record) if f.name not in expected["fields"]}
    assert all(d is not dataclasses.MISSING for d in added.values()), f"added fields need defaults: {added}"
    assert got == {**expected["fields"], **added}
    fields = dict(expected["fields"])
    if "tool_calls" in fields:
        fields["tool_calls"] = tuple(fields["tool_calls"])
    assert record == RECORD_TYPES[expected["type"]](**fields)
