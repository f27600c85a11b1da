"""Claim-level hallucination evals: captions -> atomic claims (exists / attribute / count) with spans,
judged against per-image ground truth (generative), and yes/no questions per claim kind (discriminative).

Files: ``extract.py`` (claims and extractors), ``truth.py`` (counts and colours per image),
``generative.py`` (rates and coverage), ``questions.py`` (POPE-style questions and scores),
``run.py`` (on a model), ``cli.py`` (``mm eval claims``).
"""

from mm.eval.claims.extract import CLAIM_KINDS, Claim, ClaimExtractor, RuleExtractor, build_extractor
from mm.eval.claims.generative import generative_scores
from mm.eval.claims.questions import ClaimQuestionConfig, build_claim_questions, discriminative_scores
from mm.eval.claims.truth import NoteTruth, ObjectTruth, note_truth, read_truth

__all__ = [
    "CLAIM_KINDS",
    "Claim",
    "ClaimExtractor",
    "ClaimQuestionConfig",
    "NoteTruth",
    "ObjectTruth",
    "RuleExtractor",
    "build_claim_questions",
    "build_extractor",
    "discriminative_scores",
    "generative_scores",
    "note_truth",
    "read_truth",
]
