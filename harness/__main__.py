"""``python -m harness`` (same as the ``harness`` command)."""

from harness.cli import main

raise SystemExit(main())
