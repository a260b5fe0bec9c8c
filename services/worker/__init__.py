"""The worker service: ``harness worker`` (see ``services.worker.main``)."""
