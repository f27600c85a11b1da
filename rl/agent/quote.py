"""Tool arguments that quote the user: a decode-time copy constraint (``decode.quote`` of ``rl agent``).

    decode: {quote: {find: [object]}}      # find's "object" is words of the user's own messages

While the policy writes the value of a quoted argument (``<tool>{"name": "find", "image": 2, "object": "``),
every token it may sample next keeps the value a *quote*: a run of consecutive words of the user's
messages (the task's question, and in a dialogue every later user message), after an optional article
("the", "a", "an"), in the user's letters or in lower case; the closing ``"`` is allowed once the value is a
whole quote. Which words it quotes is still the policy's choice: the constraint only takes away the words
the user never wrote. "How many tiny mice are on the tray?" allows "the tiny mice", "mice" or "tray",
never "the tiny notebooks".

It is a copy mechanism for small language models that name what they see instead of what they were asked
(docs/results.md, "Quoting the user"): grammar-constrained decoding of tool arguments, as JSON-schema
guided decoding constrains a call's keys and enums, with the user's words as the enum. Log-probs are the
model's own (unconstrained) ones, as in guided decoding with vLLM, so GRPO's ratios are unchanged.

:func:`quotes` lists the allowed values, :class:`QuoteTrie` holds them by character, :func:`open_value` finds
a quoted argument being written, :func:`token_pieces` gives each token's text, and :class:`QuoteProcessor` is
the transformers logits processor the agent backend adds to ``generate``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

ARTICLES = ("the", "a", "an")
"""Words a quote may start with that the user need not have written."""
MAX_WORDS = 6
"""Longest quote, in words (not counting the article)."""
_WORD = re.compile(r"[A-Za-z0-9]+")
_TOOL = re.compile(r"<tool>(?!.*</tool>)(.*)\Z", re.S)
_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def quotes(user_text: str, max_words: int = MAX_WORDS) -> set[str]:
    """Every allowed value: runs of 1..``max_words`` consecutive words of ``user_text``, as written and in
    lower case, each also after an article ("the tiny mice")."""
    words = _WORD.findall(user_text)
    runs = {
        " ".join(words[i:j])
        for i in range(len(words))
        for j in range(i + 1, min(i + max_words, len(words)) + 1)
    }
    runs |= {r.lower() for r in runs}
    return runs | {f"{a} {r}" for r in runs for a in ARTICLES}


class QuoteTrie:
    """The allowed values, character by character, each ended by the closing ``"``; past that ``"``
    anything may follow (the rest of the call)."""

    END = '"'

    def __init__(self, values: set[str]) -> None:
        self.root: dict[str, Any] = {}
        for v in values:
            node = self.root
            for ch in v + self.END:
                node = node.setdefault(ch, {})
            node[None] = True  # past the closing quote

    def node(self, prefix: str) -> dict[str, Any] | None:
        """The node after ``prefix`` (a value being written), or None when no value starts so."""
        node: dict[str, Any] | None = self.root
        for ch in prefix:
            node = node.get(ch) if node is not None else None
            if node is None:
                return None
        return node

    @staticmethod
    def allows(node: dict[str, Any], piece: str) -> bool:
        """Whether ``piece`` may follow the value at ``node``."""
        for ch in piece:
            if None in node:  # the value is closed: the rest of the call is free
                return True
            nxt = node.get(ch)
            if nxt is None:
                return False
            node = nxt
        return True


def open_value(text: str, quote: Mapping[str, Sequence[str]]) -> str | None:
    """The part of a quoted argument's value written so far, when ``text`` (a turn so far) ends inside one:
    an open ``<tool>`` call of a tool of ``quote`` whose argument of ``quote[tool]`` has an open string
    value; None otherwise."""
    call = _TOOL.search(text)
    if call is None:
        return None
    body = call.group(1)
    name = _NAME.search(body)
    if name is None or name.group(1) not in quote:
        return None
    for arg in quote[name.group(1)]:
        m = re.search(rf'"{re.escape(arg)}"\s*:\s*"([^"]*)\Z', body)
        if m:
            return m.group(1)
    return None


def quote_of(items: Sequence[str]) -> dict[str, list[str]]:
    """``["find.object", ...]`` (``rl agent-eval --quote``) -> ``{"find": ["object"]}``."""
    from mm.errors import UserError

    out: dict[str, list[str]] = {}
    for item in items:
        tool, dot, arg = item.partition(".")
        if not (dot and tool and arg):
            raise UserError(f"--quote {item!r}: give TOOL.ARG, e.g. --quote find.object")
        out.setdefault(tool, []).append(arg)
    return out


def check_quote(quote: Mapping[str, Sequence[str]], registry: Any) -> None:
    """A UserError unless every tool of ``quote`` is in ``registry`` and every argument named is one of its
    string arguments."""
    from mm.errors import UserError

    for tool, args in quote.items():
        if tool not in registry:
            raise UserError(
                f"decode.quote names tool {tool!r}, which no loaded module registers; add its module to "
                "tool_modules or drop it from decode.quote"
            )
        props = registry[tool].schema.get("properties", {})
        strings = sorted(k for k, v in props.items() if v.get("type") == "string")
        for arg in args:
            if arg not in strings:
                raise UserError(
                    f"decode.quote: {tool!r} has no string argument {arg!r}; its string arguments: "
                    f"{strings or 'none'}"
                )


def token_pieces(tokenizer: Any) -> list[str]:
    """Each token id's text as it reads after another word (a byte-level token's leading space kept)."""
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"]
    head = tokenizer.decode(anchor)
    n = len(tokenizer)
    return [tokenizer.decode([*anchor, t])[len(head) :] for t in range(n)]


class QuoteProcessor:
    """A transformers logits processor: in row ``b``, while a quoted argument is being written, tokens that
    would leave every quote of ``user_texts[b]`` get ``-inf`` (module docstring). A row with no allowed token
    (a value the user's words cannot close) is left as it is."""

    def __init__(
        self,
        decode: Any,
        pieces: Sequence[str],
        prompt_length: int,
        user_texts: Sequence[str],
        quote: Mapping[str, Sequence[str]],
    ) -> None:
        self.decode, self.pieces, self.prompt_length, self.quote = decode, pieces, prompt_length, quote
        self.tries = [QuoteTrie(quotes(t)) for t in user_texts]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids: (B, P + t) ids so far; scores: (B, V) next-token scores
        scores = scores.clone()  # generate keeps the raw logits it passed in (the log-probs): never edit them
        for b, row in enumerate(input_ids[:, self.prompt_length :].tolist()):
            value = open_value(self.decode(row), self.quote)
            if value is None:
                continue
            node = self.tries[b].node(value)
            if node is None:
                continue
            V = min(scores.shape[1], len(self.pieces))
            allowed = [t for t in range(V) if self.pieces[t] and QuoteTrie.allows(node, self.pieces[t])]
            if allowed:
                keep = torch.full_like(scores[b], float("-inf"))
                keep[allowed] = scores[b, allowed]
                scores[b] = keep
        return scores
