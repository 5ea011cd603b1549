"""The compose stack, built and run for real (opt-in: --run-compose)."""
