"""engine_ext.loader.open_model: one call from a GGUF to a servable bundle."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from slotserve.bench import synthetic
from slotserve.engine_ext import SlotPool
from slotserve.engine_ext.gguf_file import ModelFile, load_model_file
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


def _mapped_kib(path: Path) -> int:
    """KiB of `path`'s pages mapped into this process (Rss of its mappings in smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's header line
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_loading_gives_back_the_file_pages_it_packed(tmp_path, monkeypatch):
    """A model file bigger than half the memory loads: once the engine has packed a matrix, it
    gives that matrix's file pages back, so a load never holds the file and its packed copy at
    once, whether one thread packs or the pool's threads share the matrices. Every tensor is
    read first (all resident); after the pool is built little of the file stays mapped
    (boundary pages, token_embd, norms). The control keeps its pages (the test can fail), and
    the logits are the same either way and for any thread count (pages given back are re-read
    if touched; a matrix is packed the same by whichever thread)."""
    preset = synthetic.shrunk(synthetic.PRESETS["qwen3-moe-tiny"], n_layers=2, moe=(16, 2, 512))
    tokens = np.arange(3, 40, dtype=np.int32)
    logits, kept = [], []
    for release, threads in ((True, 1), (True, 3), (False, 2)):
        path = synthetic.write_synthetic(tmp_path / f"m{release}{threads}.gguf", preset)  # 8.5 MB
        if not release:
            monkeypatch.setattr(ModelFile, "read_only_map", property(lambda self: False))
        model = load_model_file(path)
        assert model.read_only_map == release
        for t in model.tensors.values():
            int(np.asarray(t.data).sum())  # every page of the file resident
        touched = _mapped_kib(path)
        assert touched >= 0.95 * path.stat().st_size / 1024
        pool = SlotPool(model, 1, 64, threads=threads)
        assert pool.n_threads == threads
        kept.append(_mapped_kib(path) / touched)
        logits.append(pool.forward([(0, tokens, 0, True)])[0])
    # measured: 0.08 to 0.17 given back, 1.0 kept
    assert kept[0] < 0.5 and kept[1] < 0.5 and kept[2] > 0.95, kept
    assert np.array_equal(logits[0], logits[1]) and np.array_equal(logits[0], logits[2])
