"""diffzoo.evaluation: scoring trained models without training code.

* :mod:`~diffzoo.evaluation.zeroshot`: zero-shot classification and image-text retrieval (Recall@k) for any
  open_clip-style model;
* :mod:`~diffzoo.evaluation.retrieval`: key-information retrieval in long contexts for the causal LM and the
  paper's attention-noise scores;
* :mod:`~diffzoo.evaluation.metrics`: scores that never credit a NaN or infinite prediction.

Importing this package imports torch only (open_clip inside the functions that use it), never Lightning;
load the model to score with :mod:`diffzoo.weights`.
"""

from .metrics import finite_rows, wrong_where_nonfinite
from .retrieval import answer_hits, attention_scores, evaluate_retrieval, retrieval_hits
from .zeroshot import (
    caption_relevance,
    encode_pairs,
    pair_retrieval,
    retrieval_recall,
    topk_hits,
    zero_shot_accuracy,
    zero_shot_classifier,
)

__all__ = [
    "answer_hits",
    "attention_scores",
    "caption_relevance",
    "encode_pairs",
    "evaluate_retrieval",
    "finite_rows",
    "pair_retrieval",
    "retrieval_hits",
    "retrieval_recall",
    "topk_hits",
    "wrong_where_nonfinite",
    "zero_shot_accuracy",
    "zero_shot_classifier",
]
