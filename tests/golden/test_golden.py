"""Old records must still decode: every checked-in golden ``.bin`` against its ``.json``.

A schema change that cannot read these bytes fails here. Do not regenerate the
files to make it pass (see ``make_golden.py``); keep the change compatible instead.
A field added later is absent from an older vector's ``.json``: it must decode to the
field's default. ``<type>@<n>.bin`` is the vector of a type's n-th schema version.
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


def _current_stem(record_type: str) -> str:
    versions = 1 + len(list((HERE.parents[1] / "schemas" / "history").glob(f"{record_type}.*.avsc")))
    return record_type if versions == 1 else f"{record_type}@{versions}"


def test_every_record_type_has_a_golden_vector() -> None:
    missing = [cls.TYPE for cls in RECORD_CLASSES if not (HERE / f"{_current_stem(cls.TYPE)}.bin").is_file()]
    assert not missing, f"add golden vectors (python tests/golden/make_golden.py) for: {missing}"


@pytest.mark.parametrize("path", BINS, ids=[p.stem for p in BINS])
def test_golden_vector_decodes(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    record = decode(path.read_bytes())
    assert expected["type"] == record.TYPE
    got = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    for f in dataclasses.fields(record):
        if f.name not in expected["fields"]:  # added after this vector was written
            assert f.default is not dataclasses.MISSING, f"{f.name} was added without a default"
            assert got.pop(f.name) == f.default, f.name
    for name in ("tool_calls", "thinking"):
        if name in got:
            got[name] = list(got[name])
    assert got == expected["fields"]
    fields = dict(expected["fields"])
    for name in ("tool_calls", "thinking"):
        if name in fields:
            fields[name] = tuple(fields[name])
    assert record == RECORD_TYPES[expected["type"]](**fields)
