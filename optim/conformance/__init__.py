"""Conformance kit (work in progress)."""
