"""The world's vocabulary: object categories, their surface forms, colours, sizes, partners.

Every category has one canonical name, a plural, synonyms (each with its own plural; some are
multi-word, some plurals irregular: knives, mice, puppies, benches), a theme (the kind of place it
belongs to) and a visual identity: a ``shape`` x ``glyph`` pair that is unique per category, so
categories are told apart by form alone and colour is a free attribute.

Co-occurrence structure (the language prior that makes captioners hallucinate): eight
``(anchor, partner)`` pairs in :data:`PARTNER_PAIRS`. In the default world an anchor's partner is
usually present too (often small, visible in its own cell), and the note texts name an absent partner
from habit (``WorldConfig.caption_prior``), so a captioner learns to name it from context.
``partners(name)`` is symmetric.

Surface forms are unique across categories: :func:`synonym_table` maps each canonical name to
every way a caption may say it, and :func:`surface_to_category` inverts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

THEMES: tuple[str, ...] = ("kitchen", "desk", "bathroom", "beach", "park", "street")
"""Scene themes; a note's images share one theme (with some off-theme objects)."""

SHAPES: tuple[str, ...] = (
    "circle",
    "square",
    "triangle_up",
    "triangle_down",
    "diamond",
    "star",
    "plus",
    "bar",
)
"""Outline shapes used by the renderer (category identity, not an attribute)."""

GLYPHS: tuple[str, ...] = ("solid", "hole", "stripe", "cross")
"""Internal pattern drawn inside the shape (category identity, not an attribute)."""

COLORS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange", "white", "cyan")
"""Colour attribute names (far apart in RGB so colour confusions stay rare)."""

COLOR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (40, 70, 235),
    "yellow": (245, 235, 40),
    "purple": (150, 40, 200),
    "orange": (250, 125, 10),
    "white": (245, 245, 245),
    "cyan": (40, 215, 225),
}
"""RGB value of each colour name."""

SIZES: tuple[str, ...] = ("small", "medium", "large")
"""Size attribute names, smallest first."""


@dataclass(frozen=True)
class Category:
    """One object category of the world."""

    name: str
    """Canonical singular name (what annotations and CHAIR report)."""
    plural: str
    """Plural of the canonical name."""
    synonyms: tuple[str, ...]
    """Other singular surface forms (may be multi-word)."""
    synonym_plurals: tuple[str, ...]
    """Plural of each synonym, aligned with ``synonyms``."""
    theme: str
    """One of :data:`THEMES`."""
    partners: tuple[str, ...]
    """Categories that co-occur with this one (symmetric)."""
    shape: str
    """Renderer outline, one of :data:`SHAPES`."""
    glyph: str
    """Renderer internal pattern, one of :data:`GLYPHS`."""

    @property
    def forms(self) -> tuple[str, ...]:
        """Every surface form: canonical, plural, synonyms and their plurals."""
        return (self.name, self.plural, *self.synonyms, *self.synonym_plurals)


# name, plural, ((synonym, synonym plural), ...), theme
_TABLE: tuple[tuple[str, str, tuple[tuple[str, str], ...], str], ...] = (
    ("fork", "forks", (("dinner fork", "dinner forks"),), "kitchen"),
    ("knife", "knives", (("table knife", "table knives"), ("blade", "blades")), "kitchen"),
    ("cup", "cups", (("mug", "mugs"), ("teacup", "teacups")), "kitchen"),
    ("saucer", "saucers", (("tea saucer", "tea saucers"),), "kitchen"),
    ("plate", "plates", (("dish", "dishes"),), "kitchen"),
    ("bottle", "bottles", (("flask", "flasks"),), "kitchen"),
    ("keyboard", "keyboards", (("computer keyboard", "computer keyboards"),), "desk"),
    ("mouse", "mice", (("computer mouse", "computer mice"),), "desk"),
    ("notebook", "notebooks", (("notepad", "notepads"), ("jotter", "jotters")), "desk"),
    ("pencil", "pencils", (("pen", "pens"),), "desk"),
    ("lamp", "lamps", (("desk lamp", "desk lamps"),), "desk"),
    ("toothbrush", "toothbrushes", (("tooth brush", "tooth brushes"),), "bathroom"),
    ("toothpaste", "toothpastes", (("toothpaste tube", "toothpaste tubes"),), "bathroom"),
    ("towel", "towels", (("bath towel", "bath towels"),), "bathroom"),
    ("soap", "soaps", (("bar of soap", "bars of soap"),), "bathroom"),
    ("mirror", "mirrors", (("looking glass", "looking glasses"),), "bathroom"),
    ("bucket", "buckets", (("pail", "pails"),), "beach"),
    ("spade", "spades", (("shovel", "shovels"),), "beach"),
    ("umbrella", "umbrellas", (("parasol", "parasols"),), "beach"),
    ("shell", "shells", (("seashell", "seashells"),), "beach"),
    ("crab", "crabs", (("sand crab", "sand crabs"),), "beach"),
    ("dog", "dogs", (("puppy", "puppies"),), "park"),
    ("ball", "balls", (("tennis ball", "tennis balls"),), "park"),
    ("tree", "trees", (("sapling", "saplings"),), "park"),
    ("bench", "benches", (("park bench", "park benches"),), "park"),
    ("kite", "kites", (("paper kite", "paper kites"),), "park"),
    ("bird", "birds", (("sparrow", "sparrows"),), "park"),
    ("car", "cars", (("automobile", "automobiles"), ("sedan", "sedans")), "street"),
    ("bus", "buses", (("minibus", "minibuses"),), "street"),
    ("bicycle", "bicycles", (("bike", "bikes"),), "street"),
    ("helmet", "helmets", (("crash helmet", "crash helmets"),), "street"),
    ("streetlight", "streetlights", (("street light", "street lights"), ("lamppost", "lampposts")), "street"),
)

PARTNER_PAIRS: tuple[tuple[str, str], ...] = (
    ("fork", "knife"),
    ("cup", "saucer"),
    ("keyboard", "mouse"),
    ("notebook", "pencil"),
    ("toothbrush", "toothpaste"),
    ("bucket", "spade"),
    ("dog", "ball"),
    ("bicycle", "helmet"),
)
"""``(anchor, partner)``: when the anchor is in a scene the partner usually is too."""
PARTNER_OF: dict[str, str] = dict(PARTNER_PAIRS)
"""Anchor -> its partner."""


def _build() -> tuple[Category, ...]:
    cats = []
    for i, (name, plural, syns, theme) in enumerate(_TABLE):
        partners = tuple(b for a, b in PARTNER_PAIRS if a == name) + tuple(
            a for a, b in PARTNER_PAIRS if b == name
        )
        cats.append(
            Category(
                name=name,
                plural=plural,
                synonyms=tuple(s for s, _ in syns),
                synonym_plurals=tuple(p for _, p in syns),
                theme=theme,
                partners=partners,
                shape=SHAPES[i % len(SHAPES)],
                glyph=GLYPHS[(i + i // len(SHAPES)) % len(GLYPHS)],
            )
        )
    return tuple(cats)


CATEGORIES: tuple[Category, ...] = _build()
"""All categories, in a fixed order (the index is the class id)."""

CATEGORY_NAMES: tuple[str, ...] = tuple(c.name for c in CATEGORIES)
"""Canonical names in :data:`CATEGORIES` order."""

ANCHORS: tuple[str, ...] = tuple(a for a, _ in PARTNER_PAIRS)
"""Anchor side of each partner pair."""

PARTNERS_OF_ANCHORS: tuple[str, ...] = tuple(b for _, b in PARTNER_PAIRS)
"""Partner side of each partner pair."""

_BY_NAME: dict[str, Category] = {c.name: c for c in CATEGORIES}


def category(name: str) -> Category:
    """The category called ``name`` (canonical); ``KeyError`` listing the known names otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown category {name!r}; known categories: {', '.join(CATEGORY_NAMES)}") from None


def partners(name: str) -> tuple[str, ...]:
    """Co-occurrence partners of category ``name`` (symmetric; empty for most categories)."""
    return category(name).partners


def synonym_table() -> dict[str, list[str]]:
    """Canonical name -> every surface form (canonical, plural, synonyms, their plurals)."""
    return {c.name: list(c.forms) for c in CATEGORIES}


@cache
def surface_to_category() -> dict[str, str]:
    """Surface form (lower case) -> canonical name; forms are unique across categories."""
    out: dict[str, str] = {}
    for c in CATEGORIES:
        for form in c.forms:
            if form in out and out[form] != c.name:
                raise AssertionError(f"surface form {form!r} used by {out[form]!r} and {c.name!r}")
            out[form] = c.name
    return out


def categories_of_theme(theme: str) -> tuple[str, ...]:
    """Canonical names of the categories whose theme is ``theme``."""
    if theme not in THEMES:
        raise KeyError(f"unknown theme {theme!r}; known themes: {', '.join(THEMES)}")
    return tuple(c.name for c in CATEGORIES if c.theme == theme)


@cache
def _forms_by_length() -> tuple[tuple[tuple[str, ...], str], ...]:
    forms = [(tuple(f.split()), c) for f, c in surface_to_category().items()]
    return tuple(sorted(forms, key=lambda fc: -len(fc[0])))


def find_mentions(text: str) -> list[str]:
    """Canonical names mentioned in ``text``, in order, longest surface form first at each word.

    Words are lower-cased and stripped of punctuation; "two computer mice" gives ``["mouse"]``.
    """
    words = ["".join(ch for ch in w if ch.isalnum()) for w in text.lower().split()]
    words = [w for w in words if w]
    out: list[str] = []
    i = 0
    forms = _forms_by_length()
    while i < len(words):
        for form, name in forms:
            if tuple(words[i : i + len(form)]) == form:
                out.append(name)
                i += len(form)
                break
        else:
            i += 1
    return out
