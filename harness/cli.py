"""The ``harness`` command: ``demo``, ``kafka-local``, ``worker``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "demo": "harness.demo:main",
        "kafka-local": "harness.testing.kafka_local:main",
        "worker": "harness.services.worker.main:main",
        "gateway": "harness.services.gateway.main:main",
        "serve": "harness.services.gateway.main:serve_main",
    }
    if not args or args[0] in ("-h", "--help") or args[0] not in commands:
        print("usage: harness {" + ",".join(commands) + "} [options]", file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    module, _, attr = commands[args[0]].partition(":")
    import importlib

    fn = getattr(importlib.import_module(module), attr)
    return int(fn(args[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
