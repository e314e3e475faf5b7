"""The model and transcoder sets behind the viewer's model panels, loaded once and shared.

1. Which: a graph's meta records where its model and sets came from (`attrgraph build` writes
   `model`, `transcoders` and, with attention features, `attn_transcoders`; cli/build.py
   `graph_sources`); `attrgraph serve --model / --transcoders / --attn-transcoders` override them
   for every graph. A graph that records none, served without them: `ViewRequestError`.
2. Loaded once per `ModelSpec` (on CPU), under a per-spec lock: concurrent first requests wait
   for the one load. At most `MAX_LOADED` specs are held; the least recently used is dropped.
3. What a loaded spec holds (`Loaded`): the model, the sets, a `ReplacementModel` for head
   loadings and, built on first use, the corpus statistics and the `GlobalWeights`.
4. The corpus: the one the MLP set's dashboards were computed on (`dashboards.h5` attributes
   `corpus` and its config's `seed`), its first `corpus_seqs(n_ctx)` sequences (about
   `CORPUS_TOKENS` tokens), read in chunks of at most `CHUNK_BYTES` of activations. Over it: every feature's
   activations (sparse, BOS position skipped) for coactivation (`coactivation`: the statistics
   of transcoders/coactivation.py for the pairs asked), and the mean norm denominators the global
   weights use (global_weights.py step 4). No dashboards file, or a corpus no package provides and
   no file holds: no coactivation statistics and raw denominators; `Corpus.note` says why.
5. `frozen_forward` swaps `block.mlp` on the model while head loadings sweep, so every forward
   here (the corpus pass) holds `model_lock(model)`, as head_loadings does; the global-weight
   queries hold it too (they read the blocks' norms).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from attrgraph.errors import ViewRequestError
from attrgraph.viewer.lru import LruCache

MAX_LOADED = 2
"""Model specs held at once (step 2)."""
CORPUS_TOKENS = 8192
"""Corpus tokens for coactivation and mean norm denominators (step 4): 64 sequences of the bundled model."""
CHUNK_BYTES = 1 << 27
"""Most bytes of dense activations one chunk of the corpus pass holds."""
MAX_CACHED = 512
"""Answers kept per loaded spec (global connections) and per server (head loadings)."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model and its sets come from: what `attrgraph build` takes."""

    model: str
    transcoders: str
    attn_transcoders: str | None = None

    def to_json(self) -> dict:
        return dict(model=self.model, transcoders=self.transcoders, attn_transcoders=self.attn_transcoders)


@dataclass
class Corpus:
    """Step 4: the corpus statistics of a loaded spec (or why there are none)."""

    note: str
    """Where the statistics come from, or why there are none."""
    acts: object | None = None
    """scipy CSC [n_positions, n_features]: every feature's activation (flat order, `flat_index`)."""
    scales: dict[str, float] | None = None
    """Mean norm denominators over the corpus (`mean_norm_scales`), None: raw."""
    n_positions: int = 0


@dataclass
class Loaded:
    """Step 3: one spec's model and sets, and what is built from them on first use."""

    spec: ModelSpec
    model: object
    sets: object
    """`TranscoderSets`."""
    replacement: object
    """`ReplacementModel` of the model and sets."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards the lazily built members."""
    corpus: Corpus | None = None
    weights: object | None = None
    """`GlobalWeights` at the corpus's mean norm denominators."""
    answers: LruCache = field(default_factory=lambda: LruCache(MAX_CACHED))
    """The global-connection answers asked of this spec."""

    @property
    def coders(self) -> list:
        """The sets in flat order (transcoders/coactivation.py): MLP set, then the attention set."""
        return [self.sets.mlp] if self.sets.attn is None else [self.sets.mlp, self.sets.attn]

    def flat(self, site: str, layer: int, feature: int) -> int:
        from transcoders.coactivation import flat_index

        return flat_index(self.coders, 1 if site == "attn" else 0, int(layer), int(feature))

    def global_weights(self):
        """`GlobalWeights` at the corpus's mean norm denominators (raw without a corpus)."""
        from attrgraph.analysis.global_weights import GlobalWeights
        from attrgraph.analysis.head_loadings import model_lock

        corpus = self.corpus_stats()
        with self.lock:
            if self.weights is None:
                with model_lock(self.model):
                    self.weights = GlobalWeights(self.model, self.sets, corpus.scales)
            return self.weights

    def corpus_stats(self) -> Corpus:
        with self.lock:
            if self.corpus is None:
                self.corpus = _corpus_stats(self)
            return self.corpus

    def coactivation(self, pairs: np.ndarray):
        """transcoders.coactivation's statistics of `pairs` [n, 2] (flat source, target) over the
        corpus, or None without one (step 4)."""
        import torch

        from transcoders.coactivation import CoactivationAccumulator

        corpus = self.corpus_stats()
        if corpus.acts is None:
            return None
        pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
        used, local = np.unique(pairs, return_inverse=True)  # only the columns the pairs name
        acc = CoactivationAccumulator(local.reshape(-1, 2), len(used))
        acc.update(torch.from_numpy(corpus.acts[:, used].toarray()))
        return acc.result()


def corpus_seqs(n_ctx: int) -> int:
    """How many sequences of `n_ctx` tokens the corpus pass reads (step 4)."""
    return max(1, -(-CORPUS_TOKENS // n_ctx))


def _corpus_stats(loaded: Loaded) -> Corpus:
    """Step 4 (the caller holds `loaded.lock`)."""
    import scipy.sparse as sp
    import torch

    from attrgraph.analysis.global_weights import mean_norm_scales
    from attrgraph.analysis.head_loadings import model_lock
    from attrgraph.graph.dashboard_lookup import load_cached, resolve_path
    from transcoders.coactivation import flat_activations
    from transcoders.errors import TranscoderError
    from transcoders.train import first_sequences, sequence_source

    path = resolve_path(loaded.spec.transcoders)
    if not path.is_file():
        return Corpus(
            f"no coactivation statistics: the set {loaded.spec.transcoders} has no dashboards file "
            f"({path}) naming the corpus its features were read on."
        )
    attrs = load_cached(path).attrs
    name = str(attrs.get("corpus", ""))
    try:
        seed = int(json.loads(attrs.get("config", "{}")).get("seed", 0))
    except (TypeError, ValueError):
        seed = 0
    model = loaded.model
    n_seqs = corpus_seqs(model.cfg.n_ctx)
    try:
        seqs = first_sequences(sequence_source(model, name, seed), n_seqs)
    except (TranscoderError, OSError, KeyError, StopIteration, ValueError) as e:
        return Corpus(
            f"no coactivation statistics: the corpus {name!r} of {path} cannot be read here "
            f"({type(e).__name__}: {e})."
        )
    n_features = sum(c.cfg.n_layers * c.cfg.d_sae for c in loaded.coders)
    chunk = max(1, CHUNK_BYTES // (4 * seqs.shape[1] * n_features))
    chunks = []
    with torch.no_grad(), model_lock(model):
        for tokens in seqs.split(chunk):
            a = flat_activations(model, loaded.coders, tokens)[:, 1:]
            chunks.append(sp.csr_array(a.reshape(-1, a.shape[-1]).numpy()))
        scales = mean_norm_scales(model, seqs.split(chunk))
    acts = sp.vstack(chunks).tocsc()
    return Corpus(
        f"coactivation over {acts.shape[0]} positions ({len(seqs)} sequences) of the corpus {name!r} "
        f"(seed {seed}) the dashboards of {loaded.spec.transcoders} were read on; norm denominators at "
        "their means over it.",
        acts,
        scales,
        acts.shape[0],
    )


class ModelHub:
    """Steps 1-2: the loaded specs of one server. `model`, `transcoders`, `attn_transcoders`:
    serve's overrides (None: what each graph's meta records)."""

    def __init__(
        self,
        model: str | None = None,
        transcoders: str | None = None,
        attn_transcoders: str | None = None,
        max_loaded: int = MAX_LOADED,
    ):
        self.model, self.transcoders, self.attn_transcoders = model, transcoders, attn_transcoders
        self.max_loaded = max_loaded
        self.lock = threading.Lock()
        self.loaded: OrderedDict[ModelSpec, Loaded] = OrderedDict()
        self.load_locks: dict[ModelSpec, threading.Lock] = {}
        self.loads = 0
        """How many specs were loaded (a test reads it)."""

    def spec_for(self, meta: dict) -> ModelSpec:
        """Step 1 for a graph with this `meta`."""
        model = self.model or meta.get("model")
        tc = self.transcoders or meta.get("transcoders")
        attn = self.attn_transcoders or meta.get("attn_transcoders")
        if not model or not tc:
            missing = " and ".join(f"--{w}" for w, v in (("model", model), ("transcoders", tc)) if not v)
            raise ViewRequestError(
                f"this graph records no {missing.replace('--', '')} it was built with; serve it with {missing}."
            )
        return ModelSpec(str(model), str(tc), None if attn is None else str(attn))

    def get(self, spec: ModelSpec) -> Loaded:
        """The loaded `spec` (step 2)."""
        with self.lock:
            hit = self.loaded.get(spec)
            if hit is not None:
                self.loaded.move_to_end(spec)
                return hit
            load_lock = self.load_locks.setdefault(spec, threading.Lock())
        with load_lock:  # one load per spec: the others wait for it
            with self.lock:
                hit = self.loaded.get(spec)
            if hit is not None:
                return hit
            loaded = _load(spec)
            with self.lock:
                self.loads += 1
                self.loaded[spec] = loaded
                while len(self.loaded) > self.max_loaded:
                    self.loaded.popitem(last=False)
            return loaded

    def for_graph(self, meta: dict) -> Loaded:
        return self.get(self.spec_for(meta))


def _load(spec: ModelSpec) -> Loaded:
    import torch

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.replacement import ReplacementModel
    from attrgraph.engine.sets import transcoder_sets
    from transcoders.formats import load_transcoders

    model = load_model(spec.model)
    model.eval()
    tc = load_transcoders(spec.transcoders)
    sets = tc if spec.attn_transcoders is None else [tc, load_transcoders(spec.attn_transcoders)]
    with torch.no_grad():
        checked = transcoder_sets(model, sets)
        replacement = ReplacementModel(model, checked)
    for c in (checked.mlp, checked.attn):
        if c is not None:
            c.eval()
    return Loaded(spec, model, checked, replacement)
