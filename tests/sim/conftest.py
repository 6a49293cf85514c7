"""Fixtures for the TEST ENGINE suite (helpers live in sim_helpers.py)."""

from sim_helpers import fresh_pd, pd  # noqa: F401 (pytest fixtures)
