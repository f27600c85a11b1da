"""Cross-modal retrieval recall: R@K note->text and text->note from two paired embedding matrices (pure).

Row i of ``notes`` pairs row i of ``texts``. Similarity is the dot product (pass L2-normalised rows for
cosine). Ties count against the query: the rank of the true item is the number of *other* items scoring
at least as high, so a constant embedding scores R@1 = 0 instead of a lucky 1 (stricter than
``argsort``-based code, which breaks ties by index).
"""

from __future__ import annotations

from torch import Tensor

DEFAULT_KS = (1, 5, 10)


def ranks(queries: Tensor, items: Tensor) -> Tensor:
    """0-based rank of item i for query i: (Q, D), (Q, D) -> (Q,) long."""
    if queries.ndim != 2 or queries.shape != items.shape:
        raise ValueError(
            f"expected paired (N, D) embedding matrices, got {tuple(queries.shape)} and {tuple(items.shape)}"
        )
    if queries.shape[0] == 0:
        raise ValueError("no rows to evaluate: got 0 pairs")
    sims = queries.double() @ items.double().T  # (Q, Q)
    true = sims.diagonal()[:, None]  # (Q, 1)
    ge = sims >= true  # (Q, Q)
    return ge.sum(1) - 1  # the diagonal always counts itself


def recall_at_k(queries: Tensor, items: Tensor, ks: tuple[int, ...] = DEFAULT_KS) -> dict[int, float]:
    """Fraction of queries whose paired item ranks in the top k, for each k in ``ks``."""
    r = ranks(queries, items)
    return {k: float((r < k).double().mean()) for k in ks}


def retrieval_metrics(notes: Tensor, texts: Tensor, ks: tuple[int, ...] = DEFAULT_KS) -> dict[str, float]:
    """``{"note2text_R@1": ..., "text2note_R@1": ..., ...}`` for every k in ``ks``."""
    out: dict[str, float] = {}
    for name, (q, it) in {"note2text": (notes, texts), "text2note": (texts, notes)}.items():
        for k, v in recall_at_k(q, it, ks).items():
            out[f"{name}_R@{k}"] = v
    return out
