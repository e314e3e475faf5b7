"""Fixtures for the attrgraph tests (helpers live in ag_helpers.py)."""

import json

import pytest

from tests.attrgraph.ag_helpers import graph_from_dense, random_graph, tiny_model, tiny_transcoders


@pytest.fixture
def make_random_graph():
    return random_graph


@pytest.fixture
def make_graph_from_dense():
    return graph_from_dense


@pytest.fixture
def make_tiny_model():
    return tiny_model


@pytest.fixture
def make_tiny_transcoders():
    return tiny_transcoders


@pytest.fixture(scope="module")
def tiny():
    """A tiny GPT-2-style model and its per-layer transcoders (the bad-input rounds' subject)."""
    model = tiny_model("gpt2")
    return model, tiny_transcoders(model)


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread (restored after): tiny models are fastest that way, and on a
    shared CPU two spinning threads can be ten times slower than one."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A model folder as `load_model` reads it (config.json, model.safetensors, tokenizer/ with the
    bundled word-level vocabulary, n_ctx 32) plus its transcoders in `tc/`. Shared: copy it before
    changing anything in it."""
    import torch
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from attrgraph.bundled import tasks
    from attrgraph.bundled.tokenizer import build_tokenizer
    from transcoders.formats import save_transcoders

    root = tmp_path_factory.mktemp("tiny_model")
    tok = build_tokenizer(tasks.vocabulary(), root / "tokenizer")
    kwargs = dict(
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_head=4,
        d_mlp=64,
        d_vocab=len(tok),
        n_ctx=32,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
    )
    (root / "config.json").write_text(json.dumps(kwargs))
    model = HookedTransformer(HookedTransformerConfig(**kwargs))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith((".mask", ".IGNORE"))},
        str(root / "model.safetensors"),
    )
    save_transcoders(tiny_transcoders(model, "plt").to(torch.float32), root / "tc")
    return root
