"""What a diff returns: the global box, the regions, and counts. Plain data, JSON-ready."""

from __future__ import annotations

from dataclasses import dataclass, field

BBox = tuple[int, int, int, int]  # inclusive (x0, y0, x1, y1)


@dataclass(frozen=True)
class Region:
    """One connected group of changes."""

    bbox: BBox
    """Inclusive ``(x0, y0, x1, y1)`` in pixels."""
    pixels: int
    """Changed pixels inside the region."""
    max_delta: float
    """Largest per-channel absolute delta of the region (in 0-255 units; 16-bit is scaled)."""
    mean_delta: float
    """Mean per-pixel max-channel delta over the region's changed pixels."""

    def to_json(self) -> dict:
        return {
            "bbox": list(self.bbox),
            "pixels": int(self.pixels),
            "max_delta": float(self.max_delta),
            "mean_delta": round(float(self.mean_delta), 4),
        }


@dataclass(frozen=True)
class Result:
    """The answer of :func:`imgdiff.diff`."""

    bbox: BBox | None
    """Minimal inclusive box of all changes, or ``None`` when the images are the same."""
    regions: list[Region] = field(default_factory=list)
    changed_pixels: int = 0
    width: int = 0
    height: int = 0

    @property
    def same(self) -> bool:
        return self.bbox is None

    def to_json(self) -> dict:
        return {
            "bbox": list(self.bbox) if self.bbox is not None else None,
            "regions": [r.to_json() for r in self.regions],
            "changed_pixels": int(self.changed_pixels),
            "width": int(self.width),
            "height": int(self.height),
        }
