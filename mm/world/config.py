"""``WorldConfig``: every knob of the synthetic note world (YAML: configs/mm/world_default.yaml)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class WorldConfig:
    """Knobs of the note generator. Defaults are the shipped default world."""

    notes: int = 2000
    """Number of notes to generate (the CLI's ``--notes`` overrides it)."""
    seed: int = 0
    """Base seed; note ``i`` uses ``default_rng([seed, i])``, so a note does not depend on ``notes``."""
    image_size: int = 64
    """Square image side in pixels."""
    images_per_note_min: int = 1
    """Fewest images in a note."""
    images_per_note_max: int = 4
    """Most images in a note (at most 4)."""
    objects_per_image_min: int = 2
    """Fewest objects in an image (before partners are added)."""
    objects_per_image_max: int = 4
    """Most objects in an image (before partners are added)."""
    off_theme: float = 0.0
    """Probability that a sampled object comes from another theme than the note's."""
    anchor_prob: float = 0.75
    """Probability that an image's first object is an anchor of a partner pair (from the note's theme)."""
    cooccurrence: float = 0.65
    """P(partner in the image | anchor in the image): the language prior that drives hallucination."""
    cooccurrence_scope: str = "note"
    """Where the co-occurrence draw is made: "image" (every image with the anchor) or "note" (once per
    note and anchor, so the partner is in all the note's anchor images or in none)."""
    partner_small: float = 0.7
    """Probability that a partner, when drawn next to its anchor, is small."""
    partner_occluded: float = 0.0
    """Probability that a partner, when drawn next to its anchor, is placed partly behind it."""
    partner_overlap: float = 0.6
    """Least a hidden partner slides under its anchor (0 = touching, 1 = centred on it)."""
    partner_overlap_max: float = 1.0
    """Most a hidden partner slides under its anchor; drawn uniformly in [partner_overlap, this]."""
    caption_prior: float = 0.55
    """Probability that the note's texts name the absent partner of an anchor it shows ("a fork and a
    knife" with no knife in sight): an annotator writing from habit, as machine-written and crowd captions
    of real training sets do. Drawn once per note and anchor; the phantom is named, without a colour, in
    every caption of an image with the anchor. Only the texts lie: objects, questions and every evaluation
    keep the true scene, so a model that learns the habit hallucinates what the image shows is not there
    (which post-training can then remove without losing recall). 0 leaves the texts true."""
    partner_spot: str = "cell"
    """Where a partner that is not hidden goes: "cell" (a free spot like any object: its own grid cell with
    ``placement: grid``) or "anchor" (right next to its anchor, where ``partner_occluded`` can hide it)."""
    placement: str = "grid"
    """Where objects (other than hidden partners) go: "free" (anywhere, kept apart) or "grid" (the centre of
    a free ``grid_cell`` x ``grid_cell`` cell, jittered): with ``grid_cell`` = the vision patch size, each
    object sits in its own patch, which a tiny ViT learns to read far faster (difficulty knob)."""
    grid_cell: int = 16
    """Cell side in pixels for ``placement: grid`` (the image side must be a multiple of it)."""
    grid_jitter: float = 2.0
    """Largest shift, in pixels, of an object's centre from its cell centre (``placement: grid``)."""
    duplicate_prob: float = 0.15
    """Probability that a sampled object repeats a category already in the image (for counts)."""
    object_scale: float = 1.0
    """Multiplies object sizes (difficulty: smaller is harder)."""
    clutter: int = 2
    """Distractor strokes (not objects) drawn under the objects of each image."""
    noise_std: float = 0.0
    """Std of Gaussian pixel noise on the 0-255 scale (difficulty; noisy PNGs are ~10x larger and slower)."""
    synonym_prob: float = 0.3
    """Probability that a caption or question uses a synonym instead of the canonical name."""
    colour_position: str = "before"
    """Where captions put an object's colour: ``before`` the noun ("a red fork", English word order) or
    ``after`` it in brackets ("a fork (red)", as mixed groups already read: "two forks (red and blue)").
    After the noun, a captioner reads the colour of an object it has already named (one attention hop);
    before it, it must pick the object and read its colour at once. Only the texts change: same seed, same
    scenes, pixels and questions."""
    colour_prob: float = 1.0
    """Probability that a caption states the colour of an object (group), drawn per mention: below 1 a
    captioner learns that a colour is optional, so post-training can teach it to leave out the colours it
    is unsure of (as it leaves out the objects it is unsure of). Only the texts change, and only the colour
    words: the same objects in the same words otherwise."""
    questions_per_note: int = 6
    """Yes/no questions per note (half yes, half no when possible)."""
    partner_negatives: float = 0.5
    """Fraction of "no" questions whose object is an absent partner of a present object (rest: random)."""
    val_fraction: float = 0.05
    """Fraction of notes in the ``val`` split."""
    test_fraction: float = 0.05
    """Fraction of notes in the ``test`` split."""
    id_prefix: str = "w"
    """Note ids are ``<prefix><index:06d>``."""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(
            self.cooccurrence_scope in ("image", "note"),
            f"cooccurrence_scope must be 'image' or 'note', got {self.cooccurrence_scope!r}",
        )
        need(
            self.colour_position in ("before", "after"),
            f"colour_position must be 'before' or 'after', got {self.colour_position!r}",
        )
        need(0.0 <= self.colour_prob <= 1.0, f"colour_prob must be in [0, 1], got {self.colour_prob}")
        need(
            self.placement in ("free", "grid"), f"placement must be 'free' or 'grid', got {self.placement!r}"
        )
        need(
            self.partner_spot in ("cell", "anchor"),
            f"partner_spot must be 'cell' or 'anchor', got {self.partner_spot!r}",
        )
        need(
            self.placement != "grid" or (self.grid_cell >= 4 and self.image_size % self.grid_cell == 0),
            f"grid_cell must be >= 4 and divide image_size {self.image_size}, got {self.grid_cell}",
        )
        need(self.notes >= 1, f"notes must be >= 1, got {self.notes}")
        need(32 <= self.image_size <= 512, f"image_size must be in [32, 512], got {self.image_size}")
        need(
            1 <= self.images_per_note_min <= self.images_per_note_max <= 4,
            "need 1 <= images_per_note_min <= images_per_note_max <= 4, got "
            f"{self.images_per_note_min}, {self.images_per_note_max}",
        )
        need(
            1 <= self.objects_per_image_min <= self.objects_per_image_max <= 8,
            "need 1 <= objects_per_image_min <= objects_per_image_max <= 8, got "
            f"{self.objects_per_image_min}, {self.objects_per_image_max}",
        )
        for name in (
            "off_theme", "anchor_prob", "cooccurrence", "caption_prior", "partner_small", "partner_occluded",
            "partner_overlap", "partner_overlap_max", "duplicate_prob", "synonym_prob", "partner_negatives",
            "val_fraction", "test_fraction",
        ):  # fmt: skip
            v = getattr(self, name)
            need(0.0 <= v <= 1.0, f"{name} must be a probability in [0, 1], got {v}")
        need(
            self.partner_overlap <= self.partner_overlap_max,
            "need partner_overlap <= partner_overlap_max, got "
            f"{self.partner_overlap}, {self.partner_overlap_max}",
        )
        need(self.val_fraction + self.test_fraction < 1.0, "val_fraction + test_fraction must be < 1")
        need(0.3 <= self.object_scale <= 2.0, f"object_scale must be in [0.3, 2.0], got {self.object_scale}")
        need(self.clutter >= 0 and self.noise_std >= 0, "clutter and noise_std must be >= 0")
        need(self.questions_per_note >= 0, f"questions_per_note must be >= 0, got {self.questions_per_note}")
