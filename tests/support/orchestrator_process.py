"""Moved to tests/support/orchestrator.py (the orchestrator runner); this name stays only for the
tests that still import it from here."""

from tests.support.orchestrator import OrchestratorProcess

__all__ = ["OrchestratorProcess"]
