"""Helpers for the attrgraph tests: hand-built and random graphs, tiny random models and transcoders."""

import numpy as np

from attrgraph.graph.graph import Graph, Nodes


def graph_from_dense(kinds, adjacency, layers=None, positions=None, logit_probs=None) -> Graph:
    """A Graph from node kinds (already in NODE_ORDER) and a dense adjacency (rows = targets)."""
    kinds = np.asarray(kinds)
    n = len(kinds)
    layers = np.zeros(n, int) if layers is None else np.asarray(layers)
    positions = np.zeros(n, int) if positions is None else np.asarray(positions)
    n_logit = int((kinds == "logit").sum())
    probs = np.full(n_logit, 1.0 / max(n_logit, 1)) if logit_probs is None else np.asarray(logit_probs)
    n_pos = int(positions.max()) + 1 if n else 1
    nodes = Nodes(
        kind=kinds,
        layer=layers,
        position=positions,
        feature=np.where(kinds == "feature", np.arange(n), -1),
        activation=np.ones(n),
        token=np.where(kinds == "logit", np.arange(n), -1),
    )
    return Graph(
        nodes=nodes,
        adjacency=np.asarray(adjacency, np.float32),
        prompt_ids=np.arange(n_pos),
        prompt_tokens=[f"t{i}" for i in range(n_pos)],
        logit_tokens=np.arange(n_logit) + 100,
        logit_probs=probs,
        logit_strings=[f"out{i}" for i in range(n_logit)],
        meta={"model": "hand-built", "n_layers": 2},
    )


def random_graph(seed: int, n_emb=3, n_err=4, n_feat=20, n_logit=3, density=0.5) -> Graph:
    """A random signed DAG in node order: every source row/column pattern strictly lower-triangular;
    embeddings and errors have no inputs; logits read from everything before them."""
    rng = np.random.default_rng(seed)
    kinds = ["embedding"] * n_emb + ["error"] * n_err + ["feature"] * n_feat + ["logit"] * n_logit
    n = len(kinds)
    A = rng.normal(size=(n, n)) * (rng.random((n, n)) < density)
    A = np.tril(A, k=-1)
    A[: n_emb + n_err] = 0.0
    A[-n_logit:, -n_logit:] = 0.0
    A[:, -n_logit:] = 0.0
    probs = rng.random(n_logit) + 0.1
    probs = np.sort(probs / probs.sum() * 0.97)[::-1]
    layers = [-1] * n_emb + [0] * n_err + sorted(rng.integers(0, 2, n_feat).tolist()) + [2] * n_logit
    return graph_from_dense(kinds, A, layers=layers, logit_probs=probs)


ARCHS = ("gpt2", "gemma2", "llama")
BLOCK_ARCHS = ("qwen3", "gemma3", "pythia")
"""Blocks beyond ARCHS (issue 32): QK-norm with grouped-query attention, Gemma-3's local/global
layers with QK-norm and norms after each sublayer, and a parallel attention + MLP block."""
TRANSCODERS = (("plt", False), ("plt", True), ("clt", False))


def tiny_model(arch: str, dtype=None, n_layers: int = 2, d_model: int = 16, d_vocab: int = 40, seed: int = 0):
    """A tiny random HookedTransformer of a GPT-2, Gemma-2 or Llama style config (as the peer
    harness builds them), with nonzero biases and norm weights so that nothing matches by accident."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    dtype = dtype or torch.float64
    common = dict(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=4,
        d_head=d_model // 4,
        d_mlp=4 * d_model,
        d_vocab=d_vocab,
        n_ctx=32,
        dtype=dtype,
        seed=seed,
        default_prepend_bos=False,
    )
    if arch == "gpt2":
        kw = dict(common, act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard")
    elif arch == "gemma2":
        kw = dict(
            common,
            act_fn="gelu_pytorch_tanh",
            normalization_type="RMS",
            final_rms=True,
            gated_mlp=True,
            positional_embedding_type="rotary",
            rotary_dim=d_model // 4,
            n_key_value_heads=2,
            use_local_attn=True,
            attn_types=(["global", "local"] * n_layers)[:n_layers],
            window_size=4,
            use_normalization_before_and_after=True,
            attn_scores_soft_cap=50.0,
            output_logits_soft_cap=0.0,
            original_architecture="Gemma2ForCausalLM",
            eps=1e-6,
        )
    elif arch == "llama":
        kw = dict(
            common,
            act_fn="silu",
            normalization_type="RMS",
            final_rms=True,
            gated_mlp=True,
            positional_embedding_type="rotary",
            rotary_dim=d_model // 4,
            n_key_value_heads=2,
            original_architecture="LlamaForCausalLM",
            eps=1e-5,
        )
    elif arch == "qwen3":  # the llama block with QK-norm (circuit-tracer's Qwen3 cases)
        kw = dict(
            common,
            act_fn="silu",
            normalization_type="RMS",
            final_rms=True,
            gated_mlp=True,
            positional_embedding_type="rotary",
            rotary_dim=d_model // 4,
            n_key_value_heads=2,
            use_qk_norm=True,
            original_architecture="Qwen3ForCausalLM",
            eps=1e-6,
        )
    elif arch == "gemma3":  # QK-norm, sliding-window and global layers, norms before and after
        kw = dict(
            common,
            act_fn="gelu_pytorch_tanh",
            normalization_type="RMS",
            final_rms=True,
            gated_mlp=True,
            positional_embedding_type="rotary",
            rotary_dim=d_model // 4,
            n_key_value_heads=2,
            use_qk_norm=True,
            use_local_attn=True,
            attn_types=(["local", "global"] * n_layers)[:n_layers],
            window_size=3,
            use_normalization_before_and_after=True,
            original_architecture="Gemma3ForCausalLM",
            eps=1e-6,
        )
    elif arch == "pythia":  # parallel attention + MLP (GPT-J, GPT-NeoX / Pythia)
        kw = dict(
            common,
            act_fn="gelu",
            normalization_type="LN",
            positional_embedding_type="rotary",
            rotary_dim=d_model // 4,
            parallel_attn_mlp=True,
            original_architecture="GPTNeoXForCausalLM",
        )
    else:
        raise ValueError(arch)
    model = HookedTransformer(HookedTransformerConfig(**kw))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.split(".")[-1]
            if leaf.startswith("b"):
                p.add_(0.1 * torch.randn(p.shape, generator=g).to(p))
            elif leaf == "w":
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=g).to(p))
    model.eval()
    return model


def tiny_transcoders(
    model,
    kind: str = "plt",
    skip: bool = False,
    d_sae: int = 24,
    seed: int = 0,
    output_before_post_norm: bool = True,
):
    """Random ReLU transcoders for `model` with about half the features active."""
    import torch

    from transcoders.clt import CrossLayerTranscoder
    from transcoders.config import TranscoderConfig
    from transcoders.plt import PerLayerTranscoder

    cfg = TranscoderConfig(
        kind=kind,
        n_layers=model.cfg.n_layers,
        d_model=model.cfg.d_model,
        d_sae=d_sae,
        activation="relu",
        skip=skip,
        output_before_post_norm=output_before_post_norm,
    )
    g = torch.Generator().manual_seed(seed + 2)
    cls = CrossLayerTranscoder if kind == "clt" else PerLayerTranscoder
    tc = cls(cfg).init_weights(generator=g).to(model.cfg.dtype)
    with torch.no_grad():
        tc.W_enc.mul_(3.0)
        tc.b_enc.copy_(0.1 * torch.randn(tc.b_enc.shape, generator=g))
        tc.b_dec.copy_(0.05 * torch.randn(tc.b_dec.shape, generator=g))
        if tc.W_skip is not None:
            tc.W_skip.copy_(0.1 * torch.randn(tc.W_skip.shape, generator=g))
    return tc


def tiny_attn_saes(model, d_sae: int = 20, seed: int = 0, activation: str = "relu"):
    """Random attention-output SAEs (`blocks.{layer}.hook_attn_out`) for `model`, about half the
    features active."""
    import torch

    from transcoders import sites
    from transcoders.config import TranscoderConfig
    from transcoders.sae import SAE

    cfg = TranscoderConfig(
        kind="sae",
        n_layers=model.cfg.n_layers,
        d_model=model.cfg.d_model,
        d_sae=d_sae,
        activation=activation,
        input_hook=sites.ATTN_OUTPUT,
        output_hook=sites.ATTN_OUTPUT,
    )
    g = torch.Generator().manual_seed(seed + 3)
    sae = SAE(cfg).init_weights(generator=g).to(model.cfg.dtype)
    with torch.no_grad():
        sae.W_enc.mul_(4.0)
        sae.b_enc.copy_(0.05 * torch.randn(sae.b_enc.shape, generator=g))
        sae.b_dec.copy_(0.05 * torch.randn(sae.b_dec.shape, generator=g))
        if sae.threshold is not None:
            sae.threshold.fill_(0.0)
    return sae


def attention_graph(arch: str = "gpt2", tokens=(0, 5, 9, 3, 17, 22, 5), **kwargs):
    """A small attribution graph with attention features and errors (site "attn") beside the MLP
    ones, from a tiny model; returns (graph, model, [transcoders, attention SAEs])."""
    import torch

    from attrgraph.engine.attribute import attribute

    model = tiny_model(arch)
    sets = [tiny_transcoders(model), tiny_attn_saes(model)]
    return attribute(model, sets, torch.tensor(tokens), **kwargs), model, sets


def bundled_attention_graph(prompt: str = "When Mary and John went to the store, John gave a drink to"):
    """The pruned graph of the bundled model on [default-plt, default-attn-sae], built from Python
    (its meta names no set, only their fingerprints); tests using it carry the `bundled` marker."""
    import torch

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import prune_graph
    from transcoders.formats import load_transcoders

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sets = [load_transcoders("default-plt"), load_transcoders("default-attn-sae")]
        return prune_graph(attribute(load_model("default"), sets, prompt, progress=False))
    finally:
        torch.set_num_threads(n)


def large_graph(n_feat: int = 2800, n_emb: int = 8, n_logit: int = 2, seed: int = 0) -> Graph:
    """A graph of ~n_feat^2 / 2 edges built as CSR (no dense matrix): every feature and logit reads
    every node before it (logits: every non-logit node); float32 values, int32 indices."""
    rng = np.random.default_rng(seed)
    n = n_emb + n_feat + n_logit
    kinds = np.array(["embedding"] * n_emb + ["feature"] * n_feat + ["logit"] * n_logit)
    counts = np.minimum(np.arange(n), n_emb + n_feat)
    counts[:n_emb] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = (np.arange(indptr[-1]) - np.repeat(indptr[:-1], counts)).astype(np.int32)
    data = rng.normal(size=indptr[-1]).astype(np.float32)
    nodes = Nodes(
        kind=kinds,
        layer=np.where(kinds == "embedding", -1, np.where(kinds == "logit", 1, 0)),
        position=np.zeros(n, int),
        feature=np.where(kinds == "feature", np.arange(n), -1),
        activation=np.ones(n),
        token=np.where(kinds == "logit", np.arange(n), -1),
    )
    import scipy.sparse as sp

    return Graph(
        nodes=nodes,
        adjacency=sp.csr_array((data, indices, indptr), shape=(n, n)),
        prompt_ids=np.arange(1),
        prompt_tokens=["t0"],
        logit_tokens=np.arange(n_logit) + 100,
        logit_probs=np.full(n_logit, 0.9 / n_logit),
        logit_strings=[f"out{i}" for i in range(n_logit)],
        meta={"model": "hand-built", "n_layers": 1},
    )


def final_bars(err: str, desc: str) -> list[str]:
    """What a terminal shows at the end of each `desc` progress bar in `err` (a tqdm stream): each bar
    is one line (redraws start with '\\r', closing it writes '\\n'), of which the last redraw is what
    the user sees. Counting '100%' instead would count redraws, which depend on timing (tqdm redraws
    a finished bar once more on close when its last update was drawn)."""
    shown = [line.split("\r")[-1].strip() for line in err.split("\n")]
    return [line for line in shown if line.startswith(f"{desc}:")]


def bars_finished(err: str, desc: str) -> int:
    """How many `desc` bars in `err` the user sees end at 100%; asserts none ends short of it."""
    bars = final_bars(err, desc)
    assert bars and all(": 100%|" in b for b in bars), (desc, bars, err)
    return len(bars)


def gain_encoder_transcoders(model, seed: int = 0):
    """A PLT whose encoder is not a plain `W_enc`: feature f of layer l reads `g[l, f] * W_enc[l][:, f]`
    (a weight-normalised encoder: `W_enc` holds directions, `g_enc` their gains, here 0.5 to 2.5), so
    code that reads `W_enc` instead of asking the set (`encoder_vectors`) is off by `g`. Otherwise
    `tiny_transcoders(model)`."""
    import torch
    from torch import nn

    from transcoders.plt import PerLayerTranscoder

    class GainEncoderPLT(PerLayerTranscoder):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.g_enc = nn.Parameter(torch.ones(cfg.n_layers, cfg.d_sae))

        def encode(self, x):
            return torch.einsum("...ld,lds->...ls", x, self.W_enc * self.g_enc[:, None, :]) + self.b_enc

        def encoder_vectors(self, layer, features=None):
            v = (self.W_enc[layer] * self.g_enc[layer]).T
            return v if features is None else v[features]

    base = tiny_transcoders(model, seed=seed)
    tc = GainEncoderPLT(base.cfg).to(model.cfg.dtype)
    tc.load_state_dict(base.state_dict(), strict=False)
    g = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        tc.g_enc.copy_(0.5 + 2 * torch.rand(tc.g_enc.shape, generator=g))
        tc.W_enc.div_(tc.g_enc[:, None, :])  # about as many features fire as in tiny_transcoders
    return tc
