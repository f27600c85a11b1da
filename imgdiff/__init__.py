"""imgdiff package."""
