"""Offline English singularisation, reproducing ``pattern.en.singularize`` (Pattern 2.6) exactly.

The original CHAIR script (Rohrbach et al., "Object Hallucination in Image Captioning", EMNLP 2018;
LisaAnne/Hallucination ``utils/chair.py``) singularises every caption token with Pattern 2.6
(``pattern/text/en/inflect.py``, itself adapted from Bermi Ferrer's Inflector). Pattern is
Python-2-era and unmaintained, so this module carries the same rule tables as data and applies
them in the same order. No downloads, no dependencies.

Faithfully kept quirks (they change CHAIR numbers, so they are part of the convention):

- the final rule strips any trailing ``s``: ``glass -> glas``, ``bus -> bu``, ``tennis -> tenni``
  (the original CHAIR code works around ``glas`` with its ``'wine glas'`` double word; a caption
  saying "bus" is therefore never matched to the COCO object *bus* by the original script);
- ``singular_uninflected`` / ``singular_uncountable`` are tested as ``entry.endswith(word)``
  (so ``ice``, which ends ``rice``, is returned unchanged);
- ``singular_irregular`` is tested as ``word.endswith(key)`` (``women -> woman``,
  ``four -> fmy`` because of the ``our -> my`` entry);
- ``singular_ie`` entries ``^pie`` / ``^tie`` are literal strings, so ``ties -> ty``.

Deviation: Pattern 2.6 iterated ``singular_irregular`` in Python 2 dict order; no two keys in
that table are suffixes of one another except where the result is the same, so insertion order
gives identical output.
"""

from __future__ import annotations

import re
from functools import lru_cache

_PLURAL_PREPOSITIONS = frozenset(
    "about above across after among around at athwart before behind below beneath beside besides "
    "between betwixt beyond but by during except for from in into near of off on onto out over since "
    "till to under until unto upon with".split()
)

# (suffix pattern, replacement), tried in order; the first that matches wins.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"(?i)(.)ae$", r"\1a"),
        (r"(?i)(.)itis$", r"\1itis"),
        (r"(?i)(.)eaux$", r"\1eau"),
        (r"(?i)(quiz)zes$", r"\1"),
        (r"(?i)(matr)ices$", r"\1ix"),
        (r"(?i)(ap|vert|ind)ices$", r"\1ex"),
        (r"(?i)^(ox)en", r"\1"),
        (r"(?i)(alias|status)es$", r"\1"),
        (r"(?i)([octop|vir])i$", r"\1us"),
        (r"(?i)(cris|ax|test)es$", r"\1is"),
        (r"(?i)(shoe)s$", r"\1"),
        (r"(?i)(o)es$", r"\1"),
        (r"(?i)(bus)es$", r"\1"),
        (r"(?i)([m|l])ice$", r"\1ouse"),
        (r"(?i)(x|ch|ss|sh)es$", r"\1"),
        (r"(?i)(m)ovies$", r"\1ovie"),
        (r"(?i)(.)ombies$", r"\1ombie"),
        (r"(?i)(s)eries$", r"\1eries"),
        (r"(?i)([^aeiouy]|qu)ies$", r"\1y"),
        (r"([aeo]l)ves$", r"\1f"),
        (r"([^d]ea)ves$", r"\1f"),
        (r"arves$", "arf"),
        (r"erves$", "erve"),
        (r"([nlw]i)ves$", r"\1fe"),
        (r"(?i)([lr])ves$", r"\1f"),
        (r"([aeo])ves$", r"\1ve"),
        (r"(?i)(sive)s$", r"\1"),
        (r"(?i)(tive)s$", r"\1"),
        (r"(?i)(hive)s$", r"\1"),
        (r"(?i)([^f])ves$", r"\1fe"),
        (r"(?i)(^analy)ses$", r"\1sis"),
        (r"(?i)((a)naly|(b)a|(d)iagno|(p)arenthe|(p)rogno|(s)ynop|(t)he)ses$", r"\1\2sis"),
        (r"(?i)(.)opses$", r"\1opsis"),
        (r"(?i)(.)yses$", r"\1ysis"),
        (r"(?i)(h|d|r|o|n|b|cl|p)oses$", r"\1ose"),
        (r"(?i)(fruct|gluc|galact|lact|ket|malt|rib|sacchar|cellul)ose$", r"\1ose"),
        (r"(?i)(.)oses$", r"\1osis"),
        (r"(?i)([ti])a$", r"\1um"),
        (r"(?i)(n)ews$", r"\1ews"),
        (r"(?i)s$", ""),
    )
)

_UNINFLECTED = (
    "bison bream breeches britches carp chassis christmas clippers cod contretemps corps debris "
    "diabetes djinn eland elk flounder gallows georgia graffiti headquarters herpes high-jinks homework "
    "innings jackanapes mackerel measles mews mumps news pincers pliers proceedings rabies salmon "
    "scissors series shears species swine swiss trout tuna whiting wildebeest"
).split()
_UNCOUNTABLE = (
    "advice bread butter cheese electricity equipment fruit furniture garbage gravel happiness "
    "information ketchup knowledge love luggage mathematics mayonnaise meat mustard news progress "
    "research rice sand software understanding water"
).split()
_IE = (
    "algerie auntie beanie birdie bogie bombie bookie collie cookie cutie doggie eyrie freebie goonie "
    "groupie hankie hippie hoagie hottie indie junkie laddie laramie lingerie meanie nightie oldie ^pie "
    "pixie quickie reverie rookie softie sortie stoolie sweetie techie ^tie toughie valkyrie veggie "
    "weenie yuppie zombie"
).split()
_IRREGULAR: tuple[tuple[str, str], ...] = (
    ("men", "man"),
    ("people", "person"),
    ("children", "child"),
    ("sexes", "sex"),
    ("axes", "axe"),
    ("moves", "move"),
    ("teeth", "tooth"),
    ("geese", "goose"),
    ("feet", "foot"),
    ("zoa", "zoon"),
    ("atlantes", "atlas"),
    ("atlases", "atlas"),
    ("beeves", "beef"),
    ("brethren", "brother"),
    ("corpora", "corpus"),
    ("corpuses", "corpus"),
    ("kine", "cow"),
    ("ephemerides", "ephemeris"),
    ("ganglia", "ganglion"),
    ("genii", "genie"),
    ("genera", "genus"),
    ("graffiti", "graffito"),
    ("helves", "helve"),
    ("leaves", "leaf"),
    ("loaves", "loaf"),
    ("monies", "money"),
    ("mongooses", "mongoose"),
    ("mythoi", "mythos"),
    ("octopodes", "octopus"),
    ("opera", "opus"),
    ("opuses", "opus"),
    ("oxen", "ox"),
    ("penes", "penis"),
    ("penises", "penis"),
    ("soliloquies", "soliloquy"),
    ("testes", "testis"),
    ("trilbys", "trilby"),
    ("turves", "turf"),
    ("numena", "numen"),
    ("occipita", "occiput"),
    ("our", "my"),
)


@lru_cache(maxsize=65536)
def singularize(word: str) -> str:
    """Singular of ``word`` by Pattern 2.6's rules (see the module docstring for its quirks)."""
    if "-" in word:  # compound words: mothers-in-law -> mother-in-law
        parts = word.split("-")
        if len(parts) > 1 and parts[1] in _PLURAL_PREPOSITIONS:
            return singularize(parts[0]) + "-" + "-".join(parts[1:])
    if word.endswith("'"):  # dogs' -> dog's
        return singularize(word[:-1]) + "'s"
    lower = word.lower()
    if any(w.endswith(lower) for w in _UNINFLECTED) or any(w.endswith(lower) for w in _UNCOUNTABLE):
        return word
    for w in _IE:
        if lower.endswith(w + "s"):
            return w
    for plural, singular in _IRREGULAR:
        if lower.endswith(plural):
            return re.sub("(?i)" + plural + "$", singular, word)
    for suffix, inflection in _RULES:
        if suffix.search(word):
            return suffix.sub(inflection, word)
    return word
