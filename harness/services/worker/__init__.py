"""The worker service: ``harness worker`` (see ``harness.services.worker.main``)."""
