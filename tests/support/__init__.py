"""Helpers shared by test suites: private Redis servers, tiny corpora, free ports."""
