"""Exceptions the transcoders package raises on purpose: one sentence, what is wrong and what to do.

`AttrgraphError` is the one root of both packages' errors (the distribution is named attrgraph). It is
defined here, in the lower package, because transcoders imports nothing from attrgraph;
`attrgraph.errors` re-exports it and derives all of its own errors from it, so `except AttrgraphError`
catches every error either package raises on purpose. This module imports nothing (attrgraph's
torch-free modules import it).
"""


class AttrgraphError(Exception):
    """Base class of every error attrgraph and transcoders raise on purpose."""


class TranscoderError(AttrgraphError):
    """Base class of every error the transcoders package raises on purpose."""


class ConfigError(TranscoderError, ValueError):
    """A `TranscoderConfig` or training config with an impossible field."""


class TranscoderMismatchError(TranscoderError, ValueError):
    """Transcoders that do not fit a model (d_model, n_layers or hook names)."""


class TranscoderNotFoundError(TranscoderError, FileNotFoundError):
    """A name or path that names no loadable transcoder set."""


class CorruptTranscoderError(TranscoderError):
    """A weights file that is truncated, unreadable, or whose shapes disagree with its config."""


class UnknownFormatError(TranscoderError, ValueError):
    """A directory or object in no format we can read, or a format name we cannot write."""


class UndeclaredFeatureAxisError(TranscoderError, KeyError):
    """A tensor of a set (or a checkpoint's tensor named after one) whose feature axis its coder never
    declared (`SparseCoder.declare_features`): sharding refuses it rather than guess or copy it."""

    def __str__(self) -> str:  # KeyError would quote the sentence
        return str(self.args[0]) if self.args else ""


class ModelStateError(TranscoderError, RuntimeError):
    """A model in a state an earlier step of a session left it in, which would change a result
    without a word: hooks still attached, weights converted past its `cfg.dtype`, parameters made
    under `torch.inference_mode()` where gradients are needed (model_state.py)."""


class ModelNameWarning(UserWarning):
    """A set recorded another model's name than the one it is used with (sites.py step 5): same
    shapes and hooks, so it runs, but on a model it was not trained for (or one done on purpose,
    as a base model's set on its instruction-tuned twin)."""


class NonFiniteError(TranscoderError, FloatingPointError):
    """NaN or inf met during training (the last good checkpoint is kept), or in a set's weights when
    it is loaded."""


class CorruptCheckpointError(TranscoderError):
    """A training checkpoint (`RUN/checkpoint`) whose meta.json or state files cannot be read, lack
    what a resume needs, do not fit the run's set, or hold NaN or inf (a good run never writes one)."""


class WriteError(TranscoderError, OSError):
    """A file that could not be written (a full disk, a file size limit, no permission); what was
    there before is unchanged."""


class RunBusyError(TranscoderError, OSError):
    """A training run folder (`--out`) that another training run is using."""


def resumes_at(checkpoint, step: int) -> str:
    """What a stopped run's line says of its checkpoint `checkpoint` holding step `step`."""
    return f"the checkpoint in {checkpoint} holds step {step}: the same command resumes there."


class Terminated(TranscoderError):
    """A training run stopped for a SIGTERM (stop_signal.py): at a step, that step's checkpoint
    written, or outside the steps; `where` says what the run folder holds (`resumes_at`). The
    commands end on its sentence with exit 143, not as an error."""

    def __init__(self, where: str):
        super().__init__(f"terminated (SIGTERM); {where}")


class StalledRankError(TranscoderError, TimeoutError):
    """A distributed run whose collective waited past its timeout for a rank that stalled or died."""


class StaleLayersError(TranscoderError, FileExistsError):
    """A save target that already holds per-layer files beyond the set's layers (a larger old save)."""


class DashboardFileError(TranscoderError, ValueError):
    """A dashboards file that is missing, not ours, of another schema version, or a bad label request."""
