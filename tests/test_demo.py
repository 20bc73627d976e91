"""The demo's unigram baseline: the entropy (nats) of the training tokens' frequencies, checked against an
independent computation (collections.Counter and math.log on a token list; megatron-core's own IndexedDataset
reader and split rule on the real demo corpus). The full demo run is not a test here (minutes on two cores)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from bio_megatron.demo import training_unigram_entropy, unigram_entropy


def _entropy(tokens: list[int]) -> float:
    counts, n = Counter(tokens), len(tokens)
    return -sum(c / n * math.log(c / n) for c in counts.values())


@pytest.mark.parametrize("tokens", [[7], [1, 1, 2, 3, 3, 3], [5, 9, 5, 2, 30521, 9, 9, 0, 0, 0, 0, 17],
                                    list(range(100))])
def test_unigram_entropy_of_a_token_list(tokens):
    assert unigram_entropy(tokens) == pytest.approx(_entropy(tokens), abs=1e-12)
    assert unigram_entropy(list(reversed(tokens))) == pytest.approx(_entropy(tokens), abs=1e-12)


def test_uniform_and_single_token_limits():
    assert unigram_entropy(list(range(64)) * 3) == pytest.approx(math.log(64))
    assert unigram_entropy([4] * 10) == 0.0


def test_baseline_of_the_demo_corpus_is_its_training_documents(pubmed_prefix):
    ds = IndexedDataset(str(pubmed_prefix))
    n_docs = len(ds.document_indices) - 1
    # megatron-core's split rule (blended_megatron_dataset_builder._get_split_indices) for tiny.yaml's 950,50,0
    n_train = int(round(0.95 * n_docs))
    train = [int(t) for i in range(int(ds.document_indices[n_train])) for t in ds[i]]
    everything = [int(t) for i in range(len(ds)) for t in ds[i]]
    assert 0 < len(train) < len(everything)
    expected = _entropy(train)
    assert training_unigram_entropy(pubmed_prefix) == pytest.approx(expected, abs=1e-9)
    assert abs(expected - _entropy(everything)) > 1e-3  # the validation documents are left out


def test_validation_baseline_scores_the_validation_tokens_by_the_training_frequencies(pubmed_prefix):
    """The yardstick for the demo's val loss: the validation documents (the last 5%: mostly PMC) scored by the
    training documents' add-one smoothed token frequencies, computed here from megatron-core's own reader."""
    from bio_megatron.demo import validation_unigram_cross_entropy

    ds = IndexedDataset(str(pubmed_prefix))
    n_docs = len(ds.document_indices) - 1
    n_train = int(round(0.95 * n_docs))
    first_val = int(ds.document_indices[n_train])
    train = Counter(int(t) for i in range(first_val) for t in ds[i])
    val = [int(t) for i in range(first_val, len(ds)) for t in ds[i]]
    vocab, n = 30522, sum(train.values())
    expected = -sum(math.log((train[t] + 1) / (n + vocab)) for t in val) / len(val)
    got = validation_unigram_cross_entropy(pubmed_prefix, vocab)
    assert got == pytest.approx(expected, abs=1e-9)
    assert got > training_unigram_entropy(pubmed_prefix) + 0.3  # the val documents are another distribution
