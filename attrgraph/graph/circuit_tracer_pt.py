"""circuit-tracer's saved graphs (`Graph.to_pt`, a `.pt` file) read as a `Graph`, so that a graph
circuit-tracer built can be stored, pruned, scored, drawn and exported here.

Seed: circuit-tracer's `graph.py` (`Graph.to_pt` / `from_pt`: a `torch.save`d dict of
`input_string`, `input_tokens`, `active_features` [n_active, 3] (layer, pos, feature),
`selected_features` (indices into active_features of the features with nodes),
`activation_values` [n_active], `adjacency_matrix` [N, N] (rows = targets), `logit_targets`
(`LogitTarget(token_str, vocab_idx)`; a tensor of ids in older files), `logit_probabilities`,
`vocab_size`, `cfg`, `scan`) and `utils/create_graph_files.py` (its node order: the selected
features, errors layer-major (`layer * n_pos + pos`), one token node per position, the logits).

1. The file is read with `torch.load(weights_only=True, mmap=True)`: no code in it runs, and
   circuit-tracer need not be installed. Its two classes, `UnifiedConfig` (the model's config, a
   plain record) and `LogitTarget`, are allowed under circuit-tracer's names as stand-ins here
   (`torch.serialization.safe_globals`), as is TransformerLens's `HookedTransformerConfig` (the
   config of older files, under the names its versions give it) with the numpy scalars and dtypes
   it holds. Anything else the pickle names is refused. Before it is read, every record of the
   archive is compared with the CRC-32 torch.save wrote for it (torch does not check the records
   it memory-maps), so that a damaged file is refused rather than read as another graph.
2. Nodes are put in `NODE_ORDER` (graph.py step 3: embeddings by position, errors by (layer,
   position), features by (layer, position, feature), logits as stored, most probable first), and
   the adjacency permuted with them, a block of rows at a time from the memory-mapped matrix, so
   that a graph of tens of thousands of nodes is never held dense twice.
3. Node fields: a feature's activation is `activation_values` at its active index; embeddings
   are `W_E[token]` in circuit-tracer (meta `embedding="token"`); embedding, error and logit
   activations are not stored (NaN). A logit target with a virtual index (`vocab_idx >=
   vocab_size`: circuit-tracer's custom targets) has token -1 and its label as its string. Every
   node circuit-tracer stored is kept, the zero error nodes of the BOS position too.
4. Token strings: from `tokenizer` (a HookedTransformer or a Hugging Face tokenizer), else from the
   tokenizer the config names when the Hugging Face cache holds it, else `[id]` with one
   `PromptWarning` saying so.
5. meta: `source` "circuit-tracer", the config's `model_name` and `n_layers`, `transcoders` (the
   scan), `prompt`, `embedding` "token", `circuit_tracer_active_features` and, where circuit-tracer
   explored fewer features than were active (`max_feature_nodes`), `circuit_tracer_explored_features`:
   such a graph lacks the unexplored features' edges (circuit-tracer drops them, where
   `attribute_adaptive` folds them into the errors). Influence is computed from the adjacency, as
   for every graph.
A file that is not such a dict, whose arrays disagree in size, whose records fail their checksums, or
whose adjacency has an edge from a later node than its target raises `GraphFileError` in one line.

Writing (`save_pt(graph, path, model)`), so that circuit-tracer's own tools (`Graph.from_pt`,
`prune_graph`, `compute_graph_scores`, `create_graph_files`) read a graph built here:
6. The dict of step 1 in circuit-tracer's node order: the features by (layer, position, feature)
   (`active_features`, all of them selected), an error node for every (layer, position) and a token
   node for every position (those the graph lacks, pruned away or the BOS position's, as zero rows
   and columns), the logits. `cfg` is a `UnifiedConfig` of the model's config; the stand-ins are
   pickled under circuit-tracer's names (`_Pickler`), so circuit-tracer need not be installed to
   write one. A custom target (token -1) gets circuit-tracer's virtual index `vocab_size + k`.
7. Refused in one line: attention-output features or errors (circuit-tracer's graph holds MLP
   transcoder nodes only), a target at another position than the last, a model of another layer
   count. A graph whose embedding nodes hold token + position embeddings (attrgraph's default) is
   written with one `ExportWarning`: circuit-tracer's token nodes are `W_E[token]` alone
   (`attribute(..., embedding="token")` builds with its convention).
"""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from attrgraph.errors import ExportError, ExportWarning, GraphError, GraphFileError, PromptWarning
from attrgraph.graph.graph import Graph, Nodes, check_graph
from attrgraph.graph.streamed_influence import logit_influence
from transcoders.arguments import as_path
from transcoders.output_folder import replaced

KEYS = (
    "adjacency_matrix",
    "active_features",
    "selected_features",
    "activation_values",
    "input_tokens",
    "cfg",
)
"""The keys of `Graph.to_pt`'s dict a graph cannot be read without."""
ROWS_PER_BLOCK = 1024
"""Rows of the dense adjacency converted at a time (step 2)."""
CRC_CHUNK = 1 << 24
"""Bytes of a record read at a time while its checksum is compared (step 1)."""


class LogitTarget(NamedTuple):
    """Stand-in for `circuit_tracer.attribution.targets.LogitTarget` (step 1)."""

    token_str: str
    vocab_idx: int


class UnifiedConfig:
    """Stand-in for `circuit_tracer.utils.tl_nnsight_mapping.UnifiedConfig`: its fields as attributes."""


class ModelConfig:
    """Stand-in for TransformerLens's `HookedTransformerConfig` (the config of older files): its
    fields as attributes, read without importing TransformerLens, whatever its version calls it."""


TL_CONFIG_NAMES = (
    "transformer_lens.config.hooked_transformer_config.HookedTransformerConfig",
    "transformer_lens.HookedTransformerConfig.HookedTransformerConfig",
)
"""Where TransformerLens versions keep `HookedTransformerConfig` (newer first)."""


def _safe_globals() -> list:
    core = getattr(np, "_core", None) or np.core  # numpy 2 and numpy 1
    scalar = core.multiarray.scalar  # a HookedTransformerConfig holds numpy floats and dtypes
    dtypes = [getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")]
    return [
        (LogitTarget, "circuit_tracer.attribution.targets.LogitTarget"),
        (UnifiedConfig, "circuit_tracer.utils.tl_nnsight_mapping.UnifiedConfig"),
        *((ModelConfig, name) for name in TL_CONFIG_NAMES),
        scalar,
        (scalar, "numpy.core.multiarray.scalar"),  # the name numpy 1 pickles it under
        np.dtype,
        *dtypes,
    ]


def _read(path: Path) -> dict:
    import torch

    if not path.is_file():
        raise GraphFileError(
            f"{path} does not exist or is not a file; pass a graph circuit-tracer saved with to_pt."
        )
    try:
        archive = zipfile.is_zipfile(path)
    except zipfile.BadZipFile as e:  # an end record that is there but damaged
        raise GraphFileError(f"{path} is damaged ({e}); save the graph again.") from None
    if not archive:
        raise GraphFileError(
            f"{path} is not a torch.save file (no zip archive); pass a graph saved with to_pt."
        )
    _check_records(path)
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()
        why = next(
            (line.strip() for line in first if "GLOBAL" in line or "Unsupported" in line),
            first[0] if first else "",
        )
        raise GraphFileError(
            f"{path} holds objects other than circuit-tracer's graph ({why[:160]}); only to_pt's dict is read, "
            "and nothing in the file is run."
        ) from None
    except Exception as e:  # noqa: BLE001 - whatever a damaged pickle makes torch's reader raise
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise GraphFileError(f"{path} is damaged or truncated ({reason}); save the graph again.") from None
    missing = [k for k in KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise GraphFileError(f"{path} lacks {missing}: it is not a graph circuit-tracer saved with to_pt.")
    return data


def _check_records(path: Path) -> None:
    """Every record of the archive against the CRC-32 torch.save wrote for it (torch reads a
    memory-mapped record without checking it), so that a damaged file is refused rather than read
    as another graph. A record whose CRC is 0 was written with `set_crc32_options(False)`: unchecked."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0 and info.file_size:
                    continue
                with archive.open(info) as record:  # zipfile compares the CRC at the record's end
                    while record.read(CRC_CHUNK):
                        pass
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise GraphFileError(f"{path} is damaged ({reason}); save the graph again.") from None


def _config(cfg) -> dict:
    """The config's fields (a UnifiedConfig stand-in or a HookedTransformerConfig) as a dict."""
    fields = vars(cfg) if hasattr(cfg, "__dict__") else {}
    return fields if "n_layers" in fields else {}


def _strings(ids: list[int], tokenizer, cfg: dict, path: Path) -> list[str]:
    if tokenizer is not None:
        tok = getattr(tokenizer, "tokenizer", None) or tokenizer  # a HookedTransformer's, or itself
        return [tok.decode([i]) for i in ids]
    name = cfg.get("tokenizer_name")
    if name:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
            return [tok.decode([i]) for i in ids]
        except (OSError, ValueError, ImportError):
            pass
    warnings.warn(
        f"{path} names no tokenizer this machine holds ({name or 'none recorded'}): prompt tokens are "
        "shown as [id]; pass tokenizer= (the model) for their text.",
        PromptWarning,
        stacklevel=3,
    )
    return [f"[{i}]" for i in ids]


def _tensor(data: dict, name: str, path: Path, dim: int):
    """`data[name]`, a tensor of `dim` dimensions, or `GraphFileError`."""
    import torch

    x = data.get(name)
    if not isinstance(x, torch.Tensor) or x.dim() != dim:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise GraphFileError(f"{path}: {name} is {shape}, not a {dim}-d tensor as to_pt writes it.")
    return x


def _int_array(x, name: str, path: Path, shape_tail: tuple = ()) -> np.ndarray:
    a = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    if a.dtype.kind not in "iu" or a.shape[1:] != shape_tail:
        raise GraphFileError(
            f"{path}: {name} has shape {a.shape} and dtype {a.dtype}; to_pt writes integers."
        )
    return a.astype(np.int64)


def load_pt(path: str | os.PathLike, tokenizer=None) -> Graph:
    """The graph circuit-tracer saved at `path` (`Graph.to_pt`) as a `Graph` (module docstring).
    `tokenizer`: a HookedTransformer or tokenizer for the prompt's token strings (step 4)."""
    import torch

    path = as_path(path, "path", GraphFileError)
    data = _read(path)
    cfg = _config(data["cfg"])
    if not isinstance(cfg.get("n_layers"), int) or cfg["n_layers"] < 1:
        raise GraphFileError(f"{path}: its cfg records no layer count; it is not a graph saved with to_pt.")
    n_layers = cfg["n_layers"]
    tokens = _int_array(data["input_tokens"], "input_tokens", path)
    active = _int_array(data["active_features"], "active_features", path, (3,))
    selected = _int_array(data["selected_features"], "selected_features", path)
    values = _tensor(data, "activation_values", path, 1).float().numpy()
    targets = data.get("logit_targets", data.get("logit_tokens"))
    if isinstance(targets, torch.Tensor):  # older files: token ids only
        targets = [LogitTarget("", int(t)) for t in targets.tolist()]
    if not isinstance(targets, list) or not all(isinstance(t, tuple) and len(t) == 2 for t in targets):
        raise GraphFileError(
            f"{path}: logit_targets is not a list of (token_str, vocab_idx); save the graph again."
        )
    probs = _tensor(data, "logit_probabilities", path, 1).float().numpy()
    A = _tensor(data, "adjacency_matrix", path, 2)
    n_pos, n_feat, n_logits = len(tokens), len(selected), len(targets)
    n = n_feat + n_layers * n_pos + n_pos + n_logits
    problems = [
        f"adjacency_matrix is {tuple(A.shape)}, not [{n}, {n}] ({n_feat} features, {n_layers} x {n_pos} errors, "
        f"{n_pos} tokens, {n_logits} logits)"
        if tuple(A.shape) != (n, n)
        else None,
        f"selected_features points past the {len(active)} active features"
        if n_feat and (selected.min() < 0 or selected.max() >= len(active))
        else None,
        f"activation_values holds {len(values)} values for {len(active)} active features"
        if len(values) != len(active)
        else None,
        f"logit_probabilities holds {len(probs)} values for {n_logits} targets"
        if len(probs) != n_logits
        else None,
    ]
    problems = [p for p in problems if p]
    if problems:
        raise GraphFileError(f"{path}: {problems[0]}; the file is not one graph circuit-tracer saved.")
    feats = active[selected]
    if n_feat and (
        (feats[:, 0] < 0).any() or (feats[:, 0] >= n_layers).any() or (feats[:, 1] >= n_pos).any()
    ):
        raise GraphFileError(
            f"{path}: active_features names layers or positions outside the model and prompt."
        )
    # step 2: our order, as indices into circuit-tracer's
    by_feature = np.lexsort((feats[:, 2], feats[:, 1], feats[:, 0])) if n_feat else np.zeros(0, np.int64)
    err0, tok0 = n_feat, n_feat + n_layers * n_pos
    order = np.concatenate(
        [
            tok0 + np.arange(n_pos),
            err0 + np.arange(n_layers * n_pos),
            by_feature,
            tok0 + n_pos + np.arange(n_logits),
        ]
    ).astype(np.int64)
    vocab = int(data.get("vocab_size") or cfg.get("d_vocab") or 0)
    logit_ids = [int(t[1]) if 0 <= int(t[1]) < vocab or not vocab else -1 for t in targets]
    logit_strings = [str(t[0]) if str(t[0]) else f"[{t[1]}]" for t in targets]
    err_layer, err_pos = np.divmod(np.arange(n_layers * n_pos), n_pos)
    f_sorted = feats[by_feature]
    nodes = Nodes(
        kind=np.array(
            ["embedding"] * n_pos
            + ["error"] * (n_layers * n_pos)
            + ["feature"] * n_feat
            + ["logit"] * n_logits
        ),
        layer=np.concatenate([np.full(n_pos, -1), err_layer, f_sorted[:, 0], np.full(n_logits, n_layers)]),
        position=np.concatenate([np.arange(n_pos), err_pos, f_sorted[:, 1], np.full(n_logits, n_pos - 1)]),
        feature=np.concatenate(
            [np.full(n_pos + n_layers * n_pos, -1), f_sorted[:, 2], np.full(n_logits, -1)]
        ),
        activation=np.concatenate(
            [
                np.full(n_pos + n_layers * n_pos, np.nan),
                values[selected[by_feature]],
                np.full(n_logits, np.nan),
            ]
        ),
        token=np.concatenate([tokens, np.full(n_layers * n_pos + n_feat, -1), logit_ids]),
        site=np.array([""] * n_pos + ["mlp"] * (n_layers * n_pos + n_feat) + [""] * n_logits),
    )
    indptr, indices, weights = [np.zeros(1, np.int64)], [], []
    columns = torch.as_tensor(order)
    index_type = np.int32 if n < 2**31 else np.int64
    for start in range(0, n, ROWS_PER_BLOCK):
        # the block's rows and columns in our order, so that its nonzeros come out sorted as CSR's are
        rows = A[torch.as_tensor(order[start : start + ROWS_PER_BLOCK])][:, columns].float().numpy()
        flat = np.flatnonzero(rows)
        r = flat // n
        col = flat - r * n
        later = np.flatnonzero(col >= r + start)
        if len(later):  # no graph circuit-tracer builds has an edge from a node after its target
            row, source = order[start + r[later[0]]], order[col[later[0]]]
            raise GraphFileError(
                f"{path}: adjacency_matrix has an edge into node {row} from node {source} (circuit-tracer's order), which "
                "no graph circuit-tracer saves holds; the file is damaged, save the graph again."
            )
        indices.append(col.astype(index_type))
        weights.append(rows.reshape(-1)[flat])
        indptr.append(indptr[-1][-1] + np.cumsum(np.bincount(r, minlength=len(rows))))
    adjacency = sp.csr_array(
        (np.concatenate(weights), np.concatenate(indices), np.concatenate(indptr)), shape=(n, n)
    )
    strings = _strings(tokens.tolist(), tokenizer, cfg, path)  # after the checks: no warning before a refusal
    meta = {
        "source": "circuit-tracer",
        "model": str(cfg.get("model_name") or ""),
        "n_layers": n_layers,
        "transcoders": " ".join(data["scan"])
        if isinstance(data.get("scan"), list)
        else str(data.get("scan") or ""),
        "prompt": str(data.get("input_string", "")),
        "embedding": "token",
        "circuit_tracer_active_features": len(active),
    }
    if n_feat < len(active):
        meta["circuit_tracer_explored_features"] = n_feat
    try:
        graph = Graph(
            nodes=nodes,
            adjacency=adjacency,
            prompt_ids=tokens,
            prompt_tokens=strings,
            logit_tokens=logit_ids,
            logit_probs=probs,
            logit_strings=logit_strings,
            meta=meta,
        )
    except GraphError as e:
        raise GraphFileError(f"{path}: its nodes do not form a graph: {e}") from None
    graph.nodes.influence = logit_influence(graph.adjacency, graph.logit_weights()).influence.astype(
        np.float32
    )
    return graph


# ------------------------------------------------------------------------------------ write
_NAMES = {
    LogitTarget: "circuit_tracer.attribution.targets\nLogitTarget\n",
    UnifiedConfig: "circuit_tracer.utils.tl_nnsight_mapping\nUnifiedConfig\n",
}
CONFIG_FIELDS = (
    "n_layers", "d_model", "d_head", "n_heads", "d_mlp", "d_vocab", "tokenizer_name", "model_name",
    "original_architecture", "n_key_value_heads", "dtype",
)  # fmt: skip
"""`UnifiedConfig`'s fields, read off the model's config."""


class _Pickler(pickle._Pickler):
    """Pickles the stand-ins under circuit-tracer's names (step 6); everything else as pickle does."""

    def save_global(self, obj, name=None):
        where = _NAMES.get(obj) if isinstance(obj, type) else None
        if where is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + where.encode("utf-8"))
        self.memoize(obj)


def _unified_config(cfg) -> UnifiedConfig:
    out = UnifiedConfig()
    for name in CONFIG_FIELDS:
        setattr(out, name, getattr(cfg, name, None))
    return out


def save_pt(graph: Graph, path: str | os.PathLike, model, scan: str | None = None) -> Path:
    """Write `graph` as circuit-tracer's `Graph.to_pt` does (steps 6 and 7), atomically. `model`:
    the HookedTransformer it was built on (or its config), for circuit-tracer's `cfg`; `scan`: its
    transcoders' identifier (default: the graph's `meta["transcoders"]`)."""
    import torch

    check_graph(graph, "save_pt")
    cfg = getattr(model, "cfg", model)
    L = getattr(cfg, "n_layers", None)
    if not isinstance(L, int):
        raise ExportError(f"save_pt takes the graph's model (or its config), got a {type(model).__name__}.")
    n, n_pos = graph.nodes, len(graph.prompt_ids)
    if (n.site == "attn").any():
        raise ExportError(
            "the graph holds attention-output features or errors; circuit-tracer's graph holds MLP "
            "transcoder nodes only, so it cannot be written as one (export_json writes both kinds)."
        )
    recorded = graph.meta.get("n_layers")
    if recorded is not None and int(recorded) != L:
        raise ExportError(
            f"the graph was built on {recorded} layers, the model given has {L}; pass its model."
        )
    logits = np.flatnonzero(n.kind == "logit")
    if (n.position[logits] != n_pos - 1).any():
        raise ExportError(
            "the graph has targets at other positions than the last; circuit-tracer's graph holds the "
            "last position's only."
        )
    if graph.meta.get("embedding", "token") != "token":
        warnings.warn(
            "the graph's embedding nodes hold token + position embeddings, circuit-tracer's W_E[token] alone: "
            "its edges from them differ from circuit-tracer's own; build with embedding='token' for its convention.",
            ExportWarning,
            stacklevel=2,
        )
    feats = np.flatnonzero(n.kind == "feature")
    order = np.lexsort((n.feature[feats], n.position[feats], n.layer[feats]))
    feats = feats[order]
    n_feat, n_logits = len(feats), len(logits)
    size = n_feat + L * n_pos + n_pos + n_logits
    index = np.empty(graph.n_nodes, np.int64)
    index[feats] = np.arange(n_feat)
    err = np.flatnonzero(n.kind == "error")
    index[err] = n_feat + n.layer[err].astype(np.int64) * n_pos + n.position[err]
    emb = np.flatnonzero(n.kind == "embedding")
    index[emb] = n_feat + L * n_pos + n.position[emb]
    index[logits] = n_feat + L * n_pos + n_pos + np.arange(n_logits)
    A = graph.adjacency.tocoo()
    dense = torch.zeros(size, size, dtype=torch.float32)
    dense[torch.as_tensor(index[A.row]), torch.as_tensor(index[A.col])] = torch.as_tensor(
        A.data, dtype=torch.float32
    )
    vocab = int(getattr(cfg, "d_vocab", 0) or 0)
    targets = [
        LogitTarget(str(s), int(t) if t >= 0 else vocab + k)
        for k, (s, t) in enumerate(zip(graph.logit_strings, graph.logit_tokens.tolist()))
    ]
    keys = np.stack([n.layer[feats], n.position[feats], n.feature[feats]], 1).astype(np.int64)
    data = {
        "input_string": str(graph.meta.get("prompt", "".join(graph.prompt_tokens))),
        "adjacency_matrix": dense,
        "cfg": _unified_config(cfg),
        "active_features": torch.as_tensor(keys.reshape(-1, 3)),
        "logit_targets": targets,
        "logit_probabilities": torch.as_tensor(graph.logit_probs, dtype=torch.float32),
        "vocab_size": vocab,
        "input_tokens": torch.as_tensor(graph.prompt_ids, dtype=torch.long),
        "selected_features": torch.arange(n_feat),
        "activation_values": torch.as_tensor(n.activation[feats], dtype=torch.float32),
        "scan": scan if scan is not None else (graph.meta.get("transcoders") or None),
    }
    path = as_path(path, "path", ExportError)
    if path.is_dir():
        raise ExportError(f"{path} is a folder; pass a file name to write, such as {path / 'graph.pt'}.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(
            f"cannot write into {path.parent} ({e.strerror}); pass a folder you can write to."
        ) from None
    # a full disk: one line, the old file, if any, unchanged; written through a Python file, whose
    # OSError torch passes on (to a path, its own writer says only "iostream error")
    with replaced(path, ExportError) as tmp, open(tmp, "wb") as f:
        torch.save(data, f, pickle_module=SimpleNamespace(__name__="pickle", Pickler=_Pickler))
    return path
