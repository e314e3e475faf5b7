"""The dashboards file: one HDF5 file per transcoder set (`<set folder>/dashboards.h5` by default).

Written only through `atomic_h5` (h5file.py's `edit_h5`: a temporary file in the
same folder, renamed over the target on success, so a crash never leaves a half-written file
under the final name). Versioned: the root attribute `schema_version` is checked on read, and a file of
another version raises `DashboardFileError` saying what to do.

Layout (schema version 2); `L` layers, `S` features per layer, `W = before + 1 + after` tokens;
every array of more than 64 entries is one gzip-9 chunk with the shuffle filter:

    attrs: format="attrgraph-dashboards", schema_version, transcoders, kind, n_layers, d_sae,
           n_tokens (corpus tokens read), n_counted (positions counted: all but position 0),
           corpus, config (JSON of the DashboardConfig), direct_path (how logits were computed)
    vocab                      [V] bytes          token strings (UTF-8), by id
    stats/count                [L, S] int32       positions where the feature is active (> 0)
    stats/min, stats/max       [L, S] f32         smallest / largest nonzero activation (0 if never)
    stats/mean                 [L, S] f32         mean nonzero activation
    hist/edges                 [B + 1] f32        log-spaced; values outside go to the end bins
    hist/counts                [L, S, B] int32    nonzero activations per bin
    top/rel_act                [L, S, K] f16      the K largest activations (K <= n_top; 0 past the
                                                  count) as fractions of stats/max
    top/{tokens,token_acts}    [L, S, K, W]       the window around each (token -1: none); token_acts
                                                  uint8 in units of stats/max / 255 (`token_acts()`)
    quantile/rel_act           [L, S, Q, P] f16   P examples from each of Q activation-quantile bins
                                                  (0: none), fractions of stats/max
    quantile/{tokens,token_acts} [L, S, Q, P, W]
    quantile/rel_inner_bounds  [L, S, Q - 1] f16  activation at each inner bin edge (sample
                                                  quantiles), fractions of stats/max; the outer
                                                  edges are stats/min and stats/max
    logits/{top,bottom}_{tokens,values} [L, S, N] direct-path logits, largest / smallest first
    labels/user/{layer,feature,label} [n]         user labels (kept when dashboards are recomputed)

`Dashboards` gives the arrays back as `top/act`, `quantile/act` and `quantile/bounds` [L, S, Q + 1]
(float32 activations) and computes `labels/auto` from the examples and logits (`auto_labels`).
Version 1 (before the issue-13 shrink, about 600 kB for the bundled sets) stored those directly,
with float32 activations, a window of 4 + 1 + 1 tokens and the automatic labels; the encoding
above plus `after=0` brought the bundled files under 400 kB (README, "Feature dashboards").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from transcoders.arguments import as_path, shown
from transcoders.config import is_whole
from transcoders.errors import DashboardFileError
from transcoders.h5file import edit_h5

FORMAT = "attrgraph-dashboards"
SCHEMA_VERSION = 2
FILE_NAME = "dashboards.h5"
_STORED = (
    "vocab",
    "stats/count",
    "stats/min",
    "stats/max",
    "top/rel_act",
    "top/tokens",
    "top/token_acts",
    "quantile/rel_act",
    "quantile/tokens",
    "quantile/token_acts",
    "quantile/rel_inner_bounds",
    "logits/top_tokens",
)
"""What a version-2 file must hold for `Dashboards` to decode it."""


def _h5py():
    import h5py

    return h5py


def _str_dtype():
    return _h5py().string_dtype("utf-8")


def atomic_h5(path: str | os.PathLike, copy_existing: bool = False):
    """The one atomic HDF5 writer (h5file.py `edit_h5`): a temporary file beside `path` (a copy of
    `path` if `copy_existing`), renamed over it on success, deleted on an exception so `path` is
    untouched."""
    return edit_h5(path, fresh=not copy_existing, error=DashboardFileError)


def _open_checked(path: Path):
    path = as_path(path, "path", DashboardFileError)
    if not path.exists():
        raise DashboardFileError(
            f"{path} does not exist; compute it with `python -m transcoders.dashboards --transcoders NAME`."
        )
    try:
        f = _h5py().File(path, "r")
    except OSError as e:
        raise DashboardFileError(
            f"{path} is not a readable HDF5 file ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "recompute the dashboards."
        ) from e
    if f.attrs.get("format") != FORMAT:
        f.close()
        raise DashboardFileError(f"{path} is not a dashboards file (no format={FORMAT!r}); pass one.")
    version = f.attrs.get("schema_version", -1)
    if not is_whole(version) or version != SCHEMA_VERSION:
        f.close()
        raise DashboardFileError(
            f"{path} has dashboards schema version {version}, this code reads version {SCHEMA_VERSION}; "
            "recompute it with `python -m transcoders.dashboards` (user labels are kept)."
        )
    return f


def _compress(kw: dict, arr: np.ndarray) -> dict:
    if arr.size > 64:
        kw.update(chunks=arr.shape, compression="gzip", compression_opts=9, shuffle=True)  # one chunk
    return kw


def _fraction_of_max(values: np.ndarray, vmax: np.ndarray) -> np.ndarray:
    """[L, S, ...] activations as float16 fractions of the feature's max [L, S] (0 where it is 0)."""
    scale = vmax.astype(np.float64).reshape(vmax.shape + (1,) * (values.ndim - vmax.ndim))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, values / scale, 0.0)
    return rel.astype(np.float16)


def encode(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays as the file stores them (module docstring): activations of the examples and the
    inner quantile edges as float16 fractions of stats/max, counts as int32, no automatic labels
    (`Dashboards` computes them). Arrays not named there pass through unchanged."""
    out = dict(data)
    out.pop("labels/auto", None)
    if "stats/count" in out:
        out["stats/count"] = out["stats/count"].astype(np.int32)
    vmax = out.get("stats/max")
    if vmax is not None:
        for group in ("top", "quantile"):
            if f"{group}/act" in out:
                out[f"{group}/rel_act"] = _fraction_of_max(out.pop(f"{group}/act"), vmax)
        if "quantile/bounds" in out:
            out["quantile/rel_inner_bounds"] = _fraction_of_max(out.pop("quantile/bounds")[..., 1:-1], vmax)
    return out


def decode(data: dict[str, np.ndarray], before: int) -> dict[str, np.ndarray]:
    """The arrays of `encode` back as float32 activations (`top/act`, `quantile/act`,
    `quantile/bounds` with stats/min and stats/max as the outer edges) and `labels/auto`."""
    out = dict(data)
    vmax = out["stats/max"].astype(np.float32)
    for group in ("top", "quantile"):
        rel = out.pop(f"{group}/rel_act")
        out[f"{group}/act"] = rel.astype(np.float32) * vmax.reshape(vmax.shape + (1,) * (rel.ndim - 2))
    inner = out.pop("quantile/rel_inner_bounds").astype(np.float32) * vmax[..., None]
    alive = (out["stats/count"] > 0)[..., None]
    lo, hi = out["stats/min"][..., None], vmax[..., None]
    out["quantile/bounds"] = np.where(alive, np.concatenate([lo, inner, hi], -1), 0.0).astype(np.float32)
    out["labels/auto"] = auto_labels(out, out["vocab"], before)
    return out


def auto_labels(data: dict[str, np.ndarray], vocab: np.ndarray, before: int) -> np.ndarray:
    """[L, S] labels: the (at most two) tokens carrying most activation among the top examples,
    then the top direct-path logit: `"Mary"/"John" -> Mary`; "dead" for a never-active feature."""
    center = data["top/tokens"][..., before]  # [L, S, K]
    acts = data["top/act"]
    L, S = center.shape[:2]
    out = np.empty((L, S), dtype=object)
    for l in range(L):
        for i in range(S):
            if data["stats/count"][l, i] == 0:
                out[l, i] = "dead"
                continue
            weight: dict[int, float] = {}
            for t, a in zip(center[l, i].tolist(), acts[l, i].tolist()):
                if t >= 0:
                    weight[t] = weight.get(t, 0.0) + a
            best = sorted(weight, key=lambda t: (-weight[t], t))[:2]
            toks = "/".join(f'"{_clean(vocab[t])}"' for t in best)
            out[l, i] = f"{toks} -> {_clean(vocab[int(data['logits/top_tokens'][l, i, 0])])}"
    return out


def _clean(s) -> str:
    return str(s).replace("\n", "\\n").strip() or repr(str(s))


def default_path(transcoders: str) -> Path:
    """Where the dashboards of a set live by default: dashboards.h5 in its folder."""
    from transcoders.paths import BUNDLED

    return BUNDLED.get(transcoders, Path(transcoders)) / FILE_NAME


def check_output(
    path: str | os.PathLike, shape: tuple[str, int, int] | None = None, fingerprint: str | None = None
) -> None:
    """Refuse, before the work, a dashboards file `path` that cannot be written or would replace
    something else: a folder, a file that is not a dashboards file (a graph file, say: the write
    replaces the whole file), a folder to create it in that cannot be written, or, given the set's
    `shape` (kind, n_layers, d_sae), the dashboards of a set of another shape (its user labels,
    which a recompute keeps, would land on other features). A dashboards file of the same set (any
    schema version) is replaced, its user labels kept. Given the set's `fingerprint`, user labels
    written for another set of the same shape (the set retrained in its folder) are refused too:
    kept, they would name other features."""
    from transcoders.output_folder import check_output_folder

    path = Path(path)
    if path.is_dir():
        raise DashboardFileError(
            f"{path} is a folder; pass a file name to write, such as {path / 'dashboards.h5'}."
        )
    if path.exists():
        try:
            with _h5py().File(path, "r") as f:
                attrs = {
                    k: f.attrs.get(k)
                    for k in ("format", "kind", "n_layers", "d_sae", "transcoder_fingerprint")
                }
                n_labels = len(f["labels/user/label"]) if "labels/user/label" in f else 0
        except OSError:
            attrs = {"format": None}
        if attrs["format"] != FORMAT:
            raise DashboardFileError(
                f"{path} exists and is not a dashboards file, and writing would replace it; pass another "
                "file name, or move it away."
            )
        known = None not in (attrs["kind"], attrs["n_layers"], attrs["d_sae"])
        theirs = (str(attrs["kind"]), int(attrs["n_layers"]), int(attrs["d_sae"])) if known else None
        if shape is not None and known and theirs != tuple(shape):
            raise DashboardFileError(
                f"{path} holds the dashboards of another set ({theirs[0]}, {theirs[1]} layers x {theirs[2]} "
                f"features; this one is {shape[0]}, {shape[1]} x {shape[2]}); pass another file name, or "
                "move it away."
            )
        theirs = attrs["transcoder_fingerprint"]
        theirs = theirs.decode() if isinstance(theirs, bytes) else theirs
        if fingerprint is not None and theirs and str(theirs) != fingerprint and n_labels:
            raise DashboardFileError(
                f"{path} holds {n_labels} user labels of another set of this shape (fingerprint {theirs}; "
                f"this one is {fingerprint}: retrained?), which would name other features now; move the file "
                "away to keep them (transcoders.set_labels copies those that still apply), or remove it."
            )
    check_output_folder(path.parent, DashboardFileError)


def write_dashboards(path: str | os.PathLike, data: dict, attrs: dict) -> Path:
    """Write `data` ({"group/name": array}, as `DashboardAccumulator.result` and friends give
    them; `encode` turns them into the stored form) and root `attrs` atomically, keeping the user
    labels of any dashboards file already at `path` (`check_output` first)."""
    path = Path(path)
    shape = tuple(attrs.get(k) for k in ("kind", "n_layers", "d_sae"))
    check_output(path, None if None in shape else shape, attrs.get("transcoder_fingerprint"))
    data = encode(data)
    user = read_user_labels(path) if path.exists() else {}
    with atomic_h5(path) as f:
        f.attrs["format"] = FORMAT
        f.attrs["schema_version"] = SCHEMA_VERSION
        for k, v in attrs.items():
            f.attrs[k] = json.dumps(v) if isinstance(v, dict | list) else v
        for name, arr in data.items():
            if arr.dtype.kind in "OU":  # fixed-length UTF-8 bytes: gzip compresses them, vlen strings not
                arr = np.array([str(s).encode() for s in arr.ravel()]).reshape(arr.shape)
                f.create_dataset(name, data=arr, **_compress({}, arr))
            else:
                f.create_dataset(name, data=arr, **_compress({}, arr))
        _write_user_labels(f, user)
    return path


def read_user_labels(path: str | os.PathLike) -> dict[tuple[int, int], str]:
    """{(layer, feature): label} of the user labels in `path` (any schema version: they are kept)."""
    try:
        f = _h5py().File(path, "r")
    except OSError as e:
        raise DashboardFileError(
            f"{path} exists but is not a readable HDF5 file ({e}); move it away and recompute."
        ) from e
    with f:
        if "labels/user" not in f:
            return {}
        g = f["labels/user"]
        return {
            (int(l), int(i)): s.decode() if isinstance(s, bytes) else str(s)
            for l, i, s in zip(g["layer"][()], g["feature"][()], g["label"][()])
        }


def _write_user_labels(f, labels: dict[tuple[int, int], str]) -> None:
    if "labels/user" in f:
        del f["labels/user"]
    g = f.require_group("labels").create_group("user")
    keys = sorted(labels)
    g.create_dataset("layer", data=np.array([k[0] for k in keys], dtype=np.int32))
    g.create_dataset("feature", data=np.array([k[1] for k in keys], dtype=np.int64))
    g.create_dataset("label", data=np.array([labels[k] for k in keys], dtype=object), dtype=_str_dtype())


_NODE = re.compile(r"^L(\d+)/F(\d+)$")


def check_feature(layer, feature, n_layers: int, d_sae: int) -> tuple[int, int]:
    """(layer, feature) as ints, or `DashboardFileError` unless both are integers inside the set
    (a negative index would read another feature's row)."""
    if not (is_whole(layer) and is_whole(feature) and 0 <= layer < n_layers and 0 <= feature < d_sae):
        raise DashboardFileError(
            f"feature L{layer}/F{feature} is outside this set ({n_layers} layers x {d_sae} features); pass one inside."
        )
    return int(layer), int(feature)


def feature_key(key) -> tuple[int, int]:
    """(layer, feature) from a (layer, feature) pair or a node name like "L1/F254"."""
    if isinstance(key, str):
        m = _NODE.match(key.split("@")[0])
        if m:
            return int(m[1]), int(m[2])
    elif isinstance(key, tuple | list) and len(key) == 2 and all(is_whole(v) for v in key):
        return int(key[0]), int(key[1])
    raise DashboardFileError(
        f"feature {key!r} is neither (layer, feature) nor a name like 'L1/F254'; pass one."
    )


def set_labels(path: str | os.PathLike, labels: dict) -> None:
    """Set user labels {feature: label} in the dashboards file `path` (feature: (layer, feature) or
    "L1/F254"; a label of None or "" removes the user label, so the automatic one shows again).
    User labels are stored apart from the automatic ones and survive recomputing the dashboards."""
    if not isinstance(labels, Mapping):
        raise DashboardFileError(
            f"labels is a {type(labels).__name__} ({shown(labels)}); pass a dict such as {{(1, 254): 'Texas'}}."
        )
    with _open_checked(path) as f:
        n_layers, d_sae = int(f.attrs["n_layers"]), int(f.attrs["d_sae"])
    current = read_user_labels(path)
    for key, label in labels.items():
        l, i = check_feature(*feature_key(key), n_layers, d_sae)
        if label is None or str(label) == "":
            current.pop((l, i), None)
        else:
            current[(l, i)] = str(label)
    with atomic_h5(path, copy_existing=True) as f:
        _write_user_labels(f, current)


LAYOUT = {
    "vocab": ("V",),
    "stats/count": ("L", "S"),
    "stats/min": ("L", "S"),
    "stats/max": ("L", "S"),
    "stats/mean": ("L", "S"),
    "hist/edges": ("B+1",),
    "hist/counts": ("L", "S", "B"),
    "top/rel_act": ("L", "S", "K"),
    "top/tokens": ("L", "S", "K", "W"),
    "top/token_acts": ("L", "S", "K", "W"),
    "quantile/rel_act": ("L", "S", "Q", "P"),
    "quantile/tokens": ("L", "S", "Q", "P", "W"),
    "quantile/token_acts": ("L", "S", "Q", "P", "W"),
    "quantile/rel_inner_bounds": ("L", "S", "Q-1"),
    "logits/top_tokens": ("L", "S", "N"),
    "logits/top_values": ("L", "S", "N"),
    "logits/bottom_tokens": ("L", "S", "N"),
    "logits/bottom_values": ("L", "S", "N"),
}
"""Each stored array's axes (the module docstring's layout): one letter, one length in a file."""
_KIND = {"token_acts": "u", "tokens": "iu", "count": "iu", "counts": "iu", "vocab": "SOU"}
"""The dtype kinds of arrays that are not floats, by how their name ends (floats otherwise)."""
_ATTRS = {"n_layers": 1, "d_sae": 1, "before": 0, "n_counted": 0}
"""The root attributes `Dashboards` reads, each a whole number of at least this."""


def check_layout(path: Path, attrs: dict, data: dict[str, np.ndarray]) -> None:
    """Refuse a file whose attributes or arrays break the layout (`LAYOUT`): a missing or mistyped
    attribute, an axis whose length differs between arrays or from n_layers / d_sae, a window that
    cannot hold `before` tokens, token ids outside the vocabulary, floats that are not finite.
    A version-2 file we wrote always passes; another tool's or a damaged one fails here in one
    sentence instead of deep in numpy."""

    def bad(why: str) -> DashboardFileError:
        return DashboardFileError(
            f"{path} is damaged: {why}; recompute it with `python -m transcoders.dashboards`."
        )

    for name, least in _ATTRS.items():
        value = attrs.get(name)
        if not is_whole(value) or value < least:
            raise bad(f"its attribute {name} is {value}, not a whole number of at least {least}")
    sizes = {"L": int(attrs["n_layers"]), "S": int(attrs["d_sae"])}
    for name, axes in LAYOUT.items():
        if name not in data:
            continue
        arr = data[name]
        kind = next((k for end, k in _KIND.items() if name.endswith(end)), "f")
        if arr.dtype.kind not in kind:
            raise bad(
                f"{name} holds {arr.dtype} values, not {'text' if 'S' in kind else 'integers' if 'i' in kind or 'u' in kind else 'floats'}"
            )
        if arr.ndim != len(axes):
            raise bad(f"{name} has shape {arr.shape}, not [{', '.join(axes)}]")
        for axis, n in zip(axes, arr.shape, strict=True):
            key, offset = (axis[0], int(axis[1:] or 0)) if len(axis) > 1 else (axis, 0)
            want = sizes.setdefault(key, n - offset)
            if n - offset != want:
                raise bad(
                    f"{name} has shape {arr.shape}: its axis {axis} is {n}, other arrays make it {want + offset}"
                )
        if kind == "f" and not np.isfinite(arr).all():
            raise bad(f"{name} holds NaN or inf")
    if not int(attrs["before"]) < sizes["W"]:
        raise bad(
            f"its attribute before is {attrs['before']}, but the example windows hold {sizes['W']} tokens"
        )
    vocab = sizes["V"]
    for name in ("top/tokens", "quantile/tokens", "logits/top_tokens", "logits/bottom_tokens"):
        if name in data and data[name].size and not (-1 <= data[name].min() and data[name].max() < vocab):
            raise bad(
                f"{name} holds token ids in [{data[name].min()}, {data[name].max()}], outside its vocab of {vocab}"
            )


class Dashboards:
    """A dashboards file read into memory (numpy arrays); `feature(layer, i)` gives one dashboard."""

    def __init__(self, path: str | os.PathLike):
        self.path = as_path(path, "path", DashboardFileError)
        with _open_checked(self.path) as f:
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            self.data = {}

            def visit(name, obj):
                if isinstance(obj, _h5py().Dataset) and not name.startswith("labels/user"):
                    v = obj[()]
                    if obj.dtype.kind in "OS":
                        v = np.array(
                            [s.decode() if isinstance(s, bytes) else s for s in v.ravel()], dtype=object
                        )
                        v = v.reshape(obj.shape)
                    self.data[name] = v

            f.visititems(visit)
        self.user_labels = read_user_labels(self.path)
        missing = [k for k in _STORED if k not in self.data]
        if missing:
            raise DashboardFileError(
                f"{self.path} lacks {missing}; it is incomplete, recompute it with `python -m transcoders.dashboards`."
            )
        check_layout(self.path, self.attrs, self.data)
        self.n_layers, self.d_sae = int(self.attrs["n_layers"]), int(self.attrs["d_sae"])
        self.data = decode(self.data, int(self.attrs["before"]))
        self.vocab = self.data["vocab"]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def frequency(self) -> np.ndarray:
        """[L, S] share of counted positions where each feature is active."""
        return self.data["stats/count"] / max(int(self.attrs["n_counted"]), 1)

    def token_acts(self, group: str) -> np.ndarray:
        """`group/token_acts` ("top" or "quantile") as float activations."""
        q = self.data[f"{group}/token_acts"].astype(np.float32)
        scale = self.data["stats/max"].reshape(self.n_layers, self.d_sae, *[1] * (q.ndim - 2)) / 255
        return q * scale

    def label(self, layer: int, feature: int) -> str:
        """The user's label if set, else the automatic one."""
        layer, feature = check_feature(layer, feature, self.n_layers, self.d_sae)
        return self.user_labels.get((layer, feature)) or str(self.data["labels/auto"][layer, feature])

    def labels(self) -> np.ndarray:
        """[L, S] labels, user labels over automatic ones."""
        out = self.data["labels/auto"].copy()
        for (l, i), s in self.user_labels.items():
            out[l, i] = s
        return out

    def _examples(self, group: str, l: int, i: int, b: int | None = None) -> list[dict]:
        act = self.data[f"{group}/act"][l, i]
        toks = self.data[f"{group}/tokens"][l, i]
        tacts = self.data[f"{group}/token_acts"][l, i] * (float(self.data["stats/max"][l, i]) / 255)
        if b is not None:  # one quantile bin
            act, toks, tacts = act[b], toks[b], tacts[b]
        act = act.reshape(-1)
        toks, tacts = toks.reshape(len(act), -1), tacts.reshape(len(act), -1)
        out = []
        before = int(self.attrs["before"])
        for a, t, ta in zip(act, toks, tacts):
            if t[before] < 0:  # an empty slot (its activation may also be a float16 0)
                continue
            keep = t >= 0
            out.append(
                {
                    "act": float(a),
                    "tokens": [str(self.vocab[x]) for x in t[keep]],
                    "token_ids": t[keep].tolist(),
                    "acts": ta[keep].astype(float).tolist(),
                    "center": int(np.count_nonzero(keep[:before])),
                }
            )
        return out

    def feature(self, layer: int, feature: int) -> dict:
        """One feature's dashboard as plain Python values (JSON-ready)."""
        l, i = check_feature(layer, feature, self.n_layers, self.d_sae)
        d = self.data
        q = d["quantile/act"].shape[-2]
        return {
            "layer": l,
            "feature": i,
            "label": self.label(l, i),
            "auto_label": str(d["labels/auto"][l, i]),
            "frequency": float(self.frequency()[l, i]),
            "count": int(d["stats/count"][l, i]),
            "min": float(d["stats/min"][l, i]),
            "max": float(d["stats/max"][l, i]),
            "mean": float(d["stats/mean"][l, i]),
            "histogram": {"edges": d["hist/edges"].tolist(), "counts": d["hist/counts"][l, i].tolist()},
            "top": self._examples("top", l, i),
            "quantiles": [
                {
                    "range": [float(d["quantile/bounds"][l, i, b]), float(d["quantile/bounds"][l, i, b + 1])],
                    "examples": self._examples("quantile", l, i, b),
                }
                for b in range(q)
            ],
            "top_logits": [
                (str(self.vocab[t]), float(v))
                for t, v in zip(d["logits/top_tokens"][l, i], d["logits/top_values"][l, i])
            ],
            "bottom_logits": [
                (str(self.vocab[t]), float(v))
                for t, v in zip(d["logits/bottom_tokens"][l, i], d["logits/bottom_values"][l, i])
            ],
        }


def dashboard_text(d: dict, n_examples: int = 4, n_logits: int = 4, name: str | None = None) -> str:
    """One feature's dashboard (`Dashboards.feature`) as a few lines of plain text, for notebooks and
    terminals: a header (name, label, share of tokens it is active on, largest activation), its top
    examples with the active token in [brackets] and each token's activation after it when nonzero,
    and the top and bottom logits of its direct path."""
    if not (isinstance(d, dict) and {"layer", "feature", "top", "top_logits"} <= d.keys()):
        raise DashboardFileError(
            f"dashboard_text takes one feature's dashboard, got a {type(d).__name__}; "
            "pass load_dashboards(path).feature(layer, feature)."
        )
    for what, value in (("n_examples", n_examples), ("n_logits", n_logits)):
        if not is_whole(value) or value < 0:
            raise DashboardFileError(f"{what} is {shown(value)}; pass a whole number, 0 or more.")
    if name is not None and not isinstance(name, str):
        raise DashboardFileError(f"name is a {type(name).__name__} ({shown(name)}); pass a str or None.")
    head = name or f"L{d['layer']}/F{d['feature']}"
    lines = [f"{head}  {d['label']!r}  active on {100 * d['frequency']:.2f}% of tokens, max {d['max']:.3g}"]
    for e in d["top"][:n_examples]:
        words = []
        for j, (t, a) in enumerate(zip(e["tokens"], e["acts"])):
            w = f"[{t}]" if j == e["center"] else t
            words.append(f"{w}:{a:.2g}" if a > 0 else w)
        lines.append(f"  {e['act']:7.3g}  " + " ".join(words))
    if d["top_logits"]:
        up = ", ".join(f"{t} {v:+.2f}" for t, v in d["top_logits"][:n_logits])
        down = ", ".join(f"{t} {v:+.2f}" for t, v in d["bottom_logits"][:n_logits])
        lines.append(f"  logits up: {up} | down: {down}")
    return "\n".join(lines)


def load_dashboards(path: str | os.PathLike) -> Dashboards:
    """Read a dashboards file (checks its format and schema version)."""
    return Dashboards(path)
