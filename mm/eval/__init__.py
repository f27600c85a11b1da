"""Evaluation: POPE and CHAIR hallucination metrics (pope.py, chair.py), retrieval, the `mm eval` CLI."""
