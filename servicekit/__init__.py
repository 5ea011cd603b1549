"""Plumbing every streamrag gRPC service starts with: ports, config, health, reflection, metrics."""
