"""Option names and defaults shared by the API, the I/O module and the CLI (pure Python, no imports).

Kept apart so that ``imgdiff --help`` and argument parsing never import NumPy or OpenCV.
"""

BACKENDS = ("auto", "numpy", "numba", "cuda")
"""Accepted ``backend`` names."""
MODES = ("exact", "robust")
"""Accepted ``mode`` names."""
DEFAULT_THRESHOLD = {"exact": 0.0, "robust": 2.0}
"""Per-channel delta (0-255 units) that counts as a change when ``threshold`` is None."""
DEFAULT_MERGE_GAP = 8
"""Regions with at most this many unchanged pixels between them merge."""
DEFAULT_MAX_PIXELS = 2 * 7680 * 4320
"""Default decompression-bomb guard: twice an 8K frame (66,355,200 pixels)."""
SUPPORTED_FORMATS = ("PNG", "JPEG", "WebP", "TIFF", "BMP")
"""Image formats :mod:`imgdiff.io` reads."""
