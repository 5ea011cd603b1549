"""Tests of the native inference engine."""
