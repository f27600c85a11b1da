"""The project's tokenizer: a byte-level BPE trained here (no download) on a fixed world corpus.

:func:`build_tokenizer` trains it deterministically on :func:`tokenizer_corpus` — every surface
form of the world vocabulary, colours, sizes, positions, numbers, the caption / question templates
(from a fixed set of generated world notes), chat prompts, and a list of common English words —
so world captions tokenize compactly (most words are one token) while any text still encodes
(byte-level: no unknown characters). The result ships in ``assets/tokenizer/``;
:func:`load_tokenizer` reads it (or builds in memory when the folder is absent, e.g. in a wheel).

Special tokens: ``<pad> <bos> <eos> <unk> <image> <im_start> <im_end>`` and the chat-role tokens
``<|system|> <|user|> <|assistant|> <|end|>``. Plain ``tokenizer(text)`` adds ``<bos>`` ... ``<eos>``
(pass ``add_special_tokens=False`` for none). Chat template (user/system turns end with ``<|end|>``,
assistant turns with ``<eos>``; the generation prompt is ``<|assistant|>``)::

    <bos><|user|><image><image>Describe the note.<|end|><|assistant|>Two photos ...<eos>

Rebuild the shipped files with ``python -m mm.data.tokenizer [OUT]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from mm.errors import UserError
from mm.world import text as wtext
from mm.world import vocab
from mm.world.config import WorldConfig
from mm.world.generate import generate_notes

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<bos>",
    "<eos>",
    "<unk>",
    "<image>",
    "<im_start>",
    "<im_end>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
"""Special tokens, ids 0..10 in this order."""

VOCAB_SIZE = 2048
"""Target vocabulary size (special tokens + 256 bytes + merges)."""

CORPUS_NOTES = 3000
"""World notes (seed 0, :data:`CORPUS_WORLD`) whose captions and questions enter the corpus."""

CORPUS_WORLD = {
    "off_theme": 0.1,
    "cooccurrence": 0.8,
    "partner_occluded": 0.8,
    "caption_prior": 0.0,
    "partner_spot": "anchor",
}
"""World settings of the corpus that differ from today's ``WorldConfig`` defaults: the defaults of the
world the shipped tokenizer was built on. Pinned so that tuning the world does not change the tokenizer
(and with it every trained model's vocabulary)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '<|end|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
"""Jinja chat template for system/user/assistant turns."""

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "assets" / "tokenizer"
"""Where the shipped tokenizer lives (repository ``assets/tokenizer``)."""

PROMPTS: tuple[str, ...] = (
    "Describe the note.",
    "Describe this note in detail.",
    "Describe image 1.",
    "What objects are in the photos?",
    "What is in image 2?",
    "Answer yes or no.",
    "Is there a cat in the image?",
    "Is there a person in the picture?",
    "Yes.",
    "No.",
    "yes",
    "no",
    "Caption the image.",
    "List the objects you can see.",
)
"""Chat prompts that should tokenize compactly."""

COMMON_WORDS = """
the a an and or of to in on at for with from by as is are was were be been being it its this that
these those there here what which who whom whose where when why how not no yes all any some many
much more most few each every both either neither one two three four five six seven eight nine ten
first second third fourth last next other another same different i you he she we they me him her us
them my your his our their mine yours do does did done doing have has had having can could will would
shall should may might must make made take took see saw seen look looks looking show shows shown
photo photos picture pictures image images note notes post posts caption captions question answer
object objects thing things left right top bottom middle center centre front back near far next
beside behind under over above below between inside outside around small medium large big little
tiny huge color colour colors colours red green blue yellow purple orange white cyan black gray grey
brown pink dark light bright new old good bad nice great best better happy day days night today
time year years people person man woman men women child children boy girl family friend friends
home house room kitchen desk bathroom beach park street city table chair bed window door wall floor
water sea sand sky sun tree trees grass road car cars food drink coffee tea breakfast lunch dinner
morning evening weekend trip travel holiday vacation love like likes liked want wanted need just
also very really too so then than only even still again never always often sometimes usually
about after before during while because if but though although however into onto out up down off
over through across against along among sitting standing lying holding using playing eating walking
riding wearing hanging placed shown visible hidden partly partially mostly counted count number
describe description detail details list named name called appears appear seems contains contain
include includes including scene scenes view shot close together alone pair pairs set group
""".split()
"""Common English words added to the corpus so everyday text stays reasonably compact."""


def tokenizer_corpus() -> list[str]:
    """The fixed training corpus (deterministic: same list on every call)."""
    lines: list[str] = []
    for c in vocab.CATEGORIES:
        lines.extend(f"a {f}. two {c.plural}. the {f}" for f in c.forms)
    lines.extend(" ".join(vocab.COLORS) for _ in range(20))
    lines.extend(" ".join((*vocab.SIZES, *wtext.NUMBERS, *wtext.ORDINALS)) for _ in range(20))
    lines.extend(" ".join(COMMON_WORDS) for _ in range(5))
    lines.extend(PROMPTS * 5)
    for note in generate_notes(WorldConfig(notes=CORPUS_NOTES, seed=0, **CORPUS_WORLD)):
        lines.append(note.text)
        lines.extend(note.image_captions)
        lines.extend(q.question for q in note.questions)
    return lines


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> Any:
    """Train the byte-level BPE on :func:`tokenizer_corpus`; a ``PreTrainedTokenizerFast``."""
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>",
        pair="<bos> $A <eos> $B <eos>",
        special_tokens=[("<bos>", bos), ("<eos>", eos)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=list(SPECIAL_TOKENS[4:]),
        model_max_length=4096,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def load_tokenizer(path: str | Path | None = None) -> Any:
    """The tokenizer saved at ``path`` (default: the shipped ``assets/tokenizer``; built when absent)."""
    p = DEFAULT_PATH if path is None else Path(path)
    if not (p / "tokenizer.json").is_file():
        if path is None:
            return build_tokenizer()
        raise UserError(
            f"no tokenizer at {p} (expected {p / 'tokenizer.json'}); build one with build_tokenizer()"
        )
    return PreTrainedTokenizerFast.from_pretrained(str(p))


def save_tokenizer(tok: Any, out: str | Path) -> list[str]:
    """Write ``tok`` with ``save_pretrained`` into ``out``; returns the file names."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return sorted(p.name for p in out.iterdir())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH
    print(f"wrote {save_tokenizer(build_tokenizer(), target)} to {target}")
