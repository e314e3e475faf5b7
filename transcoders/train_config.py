"""What a training run is: its options (`TrainConfig`), the set they train, and where its model and
tokens come from; train.py (the command) and trainer.py (the loop) both read it.

1. `TrainConfig`: one frozen dataclass, a docstring per field, checked in `__post_init__`; the CLI of
   `python -m transcoders.train` is built from it (config_cli.py). `DEFAULTS` are its defaults (a
   checkpoint written before an option existed resumes as if it had its default); `RESUME_FREE` are
   the options a resumed run may change.
2. `transcoder_config`: the set a config trains, for a model.
3. The model (`load_any_model`, `model_device`) and the token sequences (`sequence_source`,
   `held_out_tokens`, `first_sequences`) from the corpus (`corpus_items`; providers.py);
   `check_paths`: the corpus and the folders a run writes, checked before the model loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from transcoders import distributed as tdist
from transcoders import providers, sites
from transcoders.activation_store import pack_sequences
from transcoders.block_layout import ATTN_OUTPUT
from transcoders.config import TranscoderConfig, check_device, is_whole
from transcoders.errors import ConfigError
from transcoders.losses import PREACT_FORMS
from transcoders.nonlinearity import PENALTIES
from transcoders.output_folder import check_output_folder
from transcoders.sites import MLP_INPUT, MLP_OUTPUT

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

HELD_OUT_SEED = 987_654  # corpus seed of held-out evaluation text (never a training seed)
RESUME_FREE = (
    "out",  # a run folder copied elsewhere resumes there
    "save_to",
    "checkpoint_every",
    "cache_dir",
    "parallel",
    "splice_with",
    "device",
    "dist_timeout",
)  # options a resumed run may change


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "plt"
    """"plt" (per-layer transcoders), "clt" (cross-layer transcoder) or "sae" (on --hook)."""
    activation: str = "jumprelu"
    """"jumprelu" (tanh penalty), "relu" (L1 penalty), "topk", "batchtopk" or "matryoshka_batchtopk"
    (auxiliary loss; the last also --matryoshka-widths)."""
    d_sae: int = 1024
    """Features per layer."""
    model: str = "default"
    """The bundled model ("default"), a model folder, or a TransformerLens name."""
    corpus: str = "bundled"
    """"bundled" (the task corpus), a .npy of token ids [n_seq, n_ctx], or a .txt of one text per line."""
    n_tokens: int = 4_000_000
    """Training tokens (steps = n_tokens // batch_size)."""
    batch_size: int = 1024
    """Tokens per step."""
    lr: float = 1e-3
    """Adam learning rate (constant, linear decay to 0 over the last 20% of steps)."""
    sparsity_coef: float = 2e-3
    """Final lambda of the sparsity penalty (tanh / L1), reached at the last step."""
    sparsity_c: float = 1.0
    """The c inside tanh(c * a * ||W_dec||)."""
    penalty: str = "tanh"
    """JumpReLU's sparsity penalty: "tanh" (the appendix: tanh(c * a * ||W_dec||)) or "l0" (DeepMind's
    L0 through the step's straight-through estimator)."""
    bandwidth: float = 1.0
    """JumpReLU's kernel width eps in the straight-through estimator (the appendix: 1.0)."""
    threshold_init: float = 0.03
    """JumpReLU's initial threshold (the appendix: 0.03); trained as log(theta)."""
    ste_to_input: bool = False
    """JumpReLU: also send the estimator's gradient to the pre-activations (the appendix's variant);
    default: the paper's H(h - theta)."""
    max_grad_norm: float = 1.0
    """Gradient clipping, on sae_lens's scale: the gradient norm of the MSE summed over the output dims
    (sae_lens's loss, where ours averages over d_model) is held at most this, i.e. ours is clipped at
    max_grad_norm / d_model; 0 turns clipping off. Before the frontier (benchmarks/frontier.py) the
    trainer clipped its own loss at 1, which never bound: that is --max-grad-norm d_model (128 for the
    bundled model), how the bundled sets were trained."""
    preact_coef: float = 0.0
    """Coefficient of the pre-activation loss (the appendix used 3e-6; off by default, see --preact-form)."""
    preact_form: str = "appendix"
    """"appendix": sum_f ReLU(-h_f) over all features; "sae_lens": sum_f ReLU(theta_f - h_f) ||W_dec_f||
    over dead features only."""
    k: int = 32
    """Features kept per layer and token for --activation topk (on average: batchtopk)."""
    matryoshka_widths: tuple[int, ...] = ()
    """For --activation matryoshka_batchtopk: the nested widths below --d-sae whose feature prefixes must
    each reconstruct the target too (e.g. --matryoshka-widths 64 256 with --d-sae 1024)."""
    auxk_coef: float = 1 / 32
    """Weight of TopK's auxiliary loss (AuxK: the top 2k dead features reconstruct the residual); 0 turns it off, and with it the work it costs."""
    skip: bool = False
    """Learn a linear skip W_skip (PLT / CLT)."""
    hook: str = ""
    """For --kind sae: the hook template it reads and writes, e.g. blocks.{layer}.hook_attn_out."""
    block_tokens: int = 65536
    """Tokens per shuffle block (memory: block_tokens * n_layers * d_model * 8 bytes)."""
    seed: int = 0
    """Seed of initialization, corpus and shuffling."""
    out: str = "runs/transcoders"
    """Run folder: checkpoint/ lives here; the trained set goes to --save-to."""
    save_to: str = ""
    """Where the trained set is saved (default <out>/transcoders)."""
    checkpoint_every: int = 500
    """Steps between checkpoints."""
    cache_dir: str = ""
    """If set, activation blocks are cached here as safetensors shards and streamed back (under torchrun --parallel data, each rank produces and reads its own part)."""
    parallel: str = "data"
    """Under torchrun: "data" (DDP, each rank a slice of every batch) or "features" (each rank a slice of every layer's features)."""
    device: str = "cpu"
    """Where the model and the set run: cpu, cuda, cuda:N or mps (under torchrun, plain cuda means each rank's LOCAL_RANK GPU)."""
    autocast: bool = False
    """Run the coder's forward and loss under bfloat16 autocast (`torch.autocast` on --device): faster
    products on a GPU's tensor cores; the weights, their gradients and Adam stay float32. Off by
    default: every figure of the bundled sets and the sharded-equals-one-process tolerance are float32's."""
    dist_timeout: float = tdist.DEFAULT_TIMEOUT_S
    """Under torchrun: seconds a collective waits for the other ranks before the run stops with StalledRankError naming the ranks that did not answer (gloo's own default is 30 minutes)."""
    splice_with: tuple[str, ...] = ()
    """Sets (bundled names or folders) spliced in together with the trained one for a second held-out CE loss recovered in the manifest (metrics "spliced_with"), e.g. default-plt for an attention SAE."""

    def __post_init__(self):
        if self.kind not in ("plt", "clt", "sae"):
            raise ConfigError(f"kind {self.kind!r} is not 'plt', 'clt' or 'sae'; pick one.")
        if self.kind == "sae" and "{layer}" not in self.hook:
            raise ConfigError(f"an SAE needs --hook, a template with {{layer}}, e.g. {ATTN_OUTPUT!r}.")
        if self.parallel not in ("data", "features"):
            raise ConfigError(f"parallel {self.parallel!r} is not 'data' or 'features'; pick one.")
        check_device(self.device)  # one sentence when this machine lacks it
        if self.penalty not in PENALTIES:
            raise ConfigError(f"penalty {self.penalty!r} is not one of {PENALTIES}; pick one.")
        if self.preact_form not in PREACT_FORMS:
            raise ConfigError(f"preact_form {self.preact_form!r} is not one of {PREACT_FORMS}; pick one.")
        if not self.bandwidth > 0 or not self.threshold_init > 0:
            raise ConfigError(
                f"bandwidth {self.bandwidth} and threshold_init {self.threshold_init} must both be positive."
            )
        for name in ("d_sae", "n_tokens", "batch_size", "k", "block_tokens", "seed", "checkpoint_every"):
            value = getattr(self, name)
            if not is_whole(value):
                whole = isinstance(value, float) and value.is_integer()  # 4e6 written for 4_000_000
                raise ConfigError(
                    f"{name} is {value!r}; pass an integer{f' ({int(value)})' if whole else ''}."
                )
        if isinstance(self.splice_with, str):
            raise ConfigError(
                f"splice_with is the string {self.splice_with!r}; pass a tuple of set names, e.g. ({self.splice_with!r},)."
            )
        if not str(self.model).strip():
            raise ConfigError("model is empty; pass 'default', a model folder or a TransformerLens name.")
        for name in ("batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} is {getattr(self, name)}; pass at least 1.")
        if not 0 < self.lr < float("inf"):
            raise ConfigError(f"lr {self.lr} is not a positive learning rate; pass one such as 1e-3.")
        for name in ("sparsity_coef", "sparsity_c", "preact_coef"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ConfigError(f"{name} {getattr(self, name)} is negative or not finite; pass 0 or more.")
        if not self.dist_timeout > 0:
            raise ConfigError(f"dist_timeout {self.dist_timeout} is not a positive number of seconds.")
        if self.block_tokens < self.batch_size:
            raise ConfigError(
                f"block_tokens {self.block_tokens} is smaller than batch_size {self.batch_size}; a shuffle "
                "block holds whole batches: raise it."
            )
        if not self.auxk_coef >= 0:
            raise ConfigError(f"auxk_coef {self.auxk_coef} is negative or NaN; pass 0 to turn AuxK off.")
        if not self.max_grad_norm >= 0:
            raise ConfigError(
                f"max_grad_norm {self.max_grad_norm} is negative or NaN; pass 0 to turn clipping off."
            )
        # the nonlinearity's own checks (activation name, k, Matryoshka widths) before any heavy work
        TranscoderConfig(
            kind="plt",
            n_layers=1,
            d_model=1,
            d_sae=self.d_sae,
            activation=self.activation,
            k=self.k,
            matryoshka_widths=self.matryoshka_widths,
        )
        if self.matryoshka_widths and max(self.matryoshka_widths) >= self.d_sae:
            raise ConfigError(
                f"matryoshka_widths {list(self.matryoshka_widths)} must stay below d_sae {self.d_sae} (the full "
                "width is always trained); drop or lower the last."
            )
        if self.n_tokens < self.batch_size:
            raise ConfigError(
                f"n_tokens {self.n_tokens} is less than one batch of {self.batch_size}; raise it."
            )


DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
"""Option defaults: a checkpoint written before an option existed resumes as if it had its default."""


def transcoder_config(cfg: TrainConfig, model: HookedTransformer) -> TranscoderConfig:
    """The set a TrainConfig trains, for `model`."""
    hooks = (cfg.hook, cfg.hook) if cfg.kind == "sae" else (MLP_INPUT, MLP_OUTPUT)
    return TranscoderConfig(
        kind=cfg.kind,
        n_layers=model.cfg.n_layers,
        d_model=model.cfg.d_model,
        d_sae=cfg.d_sae,
        activation=cfg.activation,
        input_hook=hooks[0],
        output_hook=hooks[1],
        skip=cfg.skip,
        k=cfg.k,
        matryoshka_widths=cfg.matryoshka_widths,
        bandwidth=cfg.bandwidth,
        ste_to_input=cfg.ste_to_input,
        output_before_post_norm=cfg.kind != "sae",
        model_name=str(model.cfg.model_name or cfg.model),
        folded_norms=sites.norms_folded(model),
    )


# ---------------------------------------------------------------------- model and corpus
def load_any_model(name: str, device: str = "cpu"):
    """The model a package provides under `name` (attrgraph: its bundled model "default", a folder or a
    TransformerLens name; providers.py), else a TransformerLens name."""
    return providers.load_model(name, device)


def model_device(cfg: TrainConfig) -> str:
    """`cfg.device`, with plain "cuda" under torchrun meaning this rank's GPU (`LOCAL_RANK`)."""
    import os

    if cfg.device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return cfg.device


def check_corpus(corpus: str) -> None:
    """Refuse, in one line, a corpus that no installed package provides and that is no file, a .npy
    that holds no integer token ids ([n_docs, n_tokens] or one stream [n_tokens]), and a text file
    without a line of text (read up to its first one)."""
    if corpus in providers.corpus_names():
        return
    path = Path(corpus)
    if not path.is_file():
        raise ConfigError(
            f"corpus {corpus!r} is no file and no installed package provides it (provided: "
            f"{providers.corpus_names()}); pass a .npy or .txt file, or (re)install attrgraph (pip install -e .) for 'bundled'."
        )
    if path.suffix == ".npy":
        _token_array(path)
    elif next(_text_lines(path), None) is None:
        raise ConfigError(f"corpus {corpus!r} holds no text; pass a file of one text per line.")


def _token_array(path: Path, d_vocab: int | None = None):
    """The .npy corpus `path` as a 2-D integer array (memory-mapped; a 1-D stream is one document),
    its ids checked against `d_vocab` when given; `ConfigError` otherwise."""
    import numpy as np

    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ConfigError(
            f"corpus {str(path)!r} is not a readable .npy of token ids ({e}); pass one."
        ) from None
    if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2) or arr.size == 0:
        raise ConfigError(
            f"corpus {str(path)!r} holds a {arr.dtype} array of shape {arr.shape}; pass integer token ids, "
            "[n_docs, n_tokens] or one stream [n_tokens]."
        )
    arr = arr.reshape(1, -1) if arr.ndim == 1 else arr
    if d_vocab is not None:
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high >= d_vocab:
            raise ConfigError(
                f"corpus {str(path)!r} holds token ids in [{low}, {high}]; the model's vocabulary is [0, {d_vocab}): "
                "tokenize it with this model's tokenizer."
            )
    return arr


def _text_lines(path: Path):
    """The non-blank lines of a text corpus; `ConfigError` naming the first that is not UTF-8."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")  # as text mode read a Windows file
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"corpus {str(path)!r} line {n} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8."
                ) from None
            if line.strip():
                yield line


def check_paths(cfg: TrainConfig) -> None:
    """Refuse, before the model loads, a corpus that is not there and a run folder (`--out`, where the
    checkpoints go) or `--save-to` folder that cannot be written: one line each, not a traceback at
    the first checkpoint or after the whole run."""
    check_corpus(cfg.corpus)
    for folder in (cfg.out, cfg.save_to or Path(cfg.out) / "transcoders"):
        check_output_folder(folder, ConfigError)


def corpus_items(corpus: str, seed: int):
    """A provided corpus (attrgraph's endless "bundled" one; providers.py), or a file's texts / token-id
    lists."""
    provided = providers.corpus(corpus, seed)
    if provided is not None:
        return provided
    check_corpus(corpus)
    path = Path(corpus)
    if path.suffix == ".npy":
        return (row.tolist() for row in _token_array(path))
    return _text_lines(path)


def sequence_source(model: HookedTransformer, corpus: str, seed: int):
    """A callable returning a fresh iterator of `n_ctx`-token sequences (activation_store step 1)."""
    tok = model.tokenizer
    n_ctx = model.cfg.n_ctx
    if corpus.endswith(".npy") and corpus not in providers.corpus_names():
        check_corpus(corpus)
        arr = _token_array(Path(corpus), model.cfg.d_vocab)
        if arr.shape[1] == n_ctx:
            return torch.from_numpy(arr.astype("int64"))

    vocab = tok.get_vocab()

    def tokenize(text: str):
        return tok(text, add_special_tokens=False)["input_ids"]

    def items():
        for item in corpus_items(corpus, seed):
            # the bundled corpus yields word tuples: map them through the vocabulary directly
            yield [vocab[w] for w in item] if isinstance(item, tuple) else item

    return lambda: pack_sequences(items(), n_ctx, tok.bos_token_id, tok.eos_token_id, tokenize)


def held_out_tokens(model: HookedTransformer, corpus: str, n_seq: int) -> torch.Tensor:
    if corpus.endswith(".npy"):
        src = sequence_source(model, corpus, 0)
        if isinstance(src, torch.Tensor):
            return src[-n_seq:]  # the last sequences of a token file are held out
    return first_sequences(sequence_source(model, corpus, HELD_OUT_SEED), n_seq)


def first_sequences(source, n: int) -> torch.Tensor:
    """[n, n_ctx] the first `n` sequences of a `sequence_source`: a token tensor's first rows, or
    the first `n` its stream yields (StopIteration when it holds fewer)."""
    if isinstance(source, torch.Tensor):
        return source[:n]
    it = source()  # token ids on the host: the activation store moves them to the model's device
    return torch.tensor([next(it) for _ in range(n)], dtype=torch.long, device="cpu")


def dist_backend() -> str:
    import torch.distributed as dist

    return dist.get_backend()


def dist_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()
