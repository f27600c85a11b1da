"""Shared test helpers (not collected: no module here starts with ``test_``)."""
