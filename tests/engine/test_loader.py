"""engine_ext.loader.open_model: one call from a GGUF to a servable bundle."""

from __future__ import annotations

import numpy as np
import pytest
from slotserve.engine_ext.gguf_file import load_model_file
from slotserve.engine_ext.loader import open_model


def test_open_model_bundles_file_tokenizer_chat_and_pool(tiny_model_path):
    bundle = open_model(tiny_model_path, num_slots=2, ctx_len=32, threads=1)
    assert bundle.model_file.config.n_vocab == bundle.tokenizer.n_vocab == bundle.pool.n_vocab == 299
    assert bundle.chat is not None and bundle.chat.render([{"role": "user", "content": "x"}]).endswith(
        "<|im_start|>assistant\n"
    )
    assert (bundle.pool.num_slots, bundle.pool.ctx_len) == (2, 32)
    ids = np.asarray(bundle.tokenizer.encode("the cat"), np.int32)
    logits = bundle.pool.forward([(1, ids, 0, True)])
    assert logits.shape == (1, 299) and np.isfinite(logits).all()
    assert bundle.pool.record(1).tolist() == ids.tolist()


def test_open_model_accepts_a_loaded_model_file(tiny_model_path):
    mf = load_model_file(tiny_model_path)
    assert open_model(mf, num_slots=1, ctx_len=8).model_file is mf


def test_open_model_errors(tmp_path, tiny_model_path):
    with pytest.raises(ValueError, match="no such model file"):
        open_model(tmp_path / "absent.gguf", num_slots=1, ctx_len=8)
    with pytest.raises(ValueError, match="num_slots"):
        open_model(tiny_model_path, num_slots=0, ctx_len=8)
