"""``python -m harness.cli`` (same as ``harness``)."""

from harness.cli import main

raise SystemExit(main())
