"""Every exception attrgraph raises on purpose: one sentence saying what is wrong and what to do.

One hierarchy: `AttrgraphError` is the root of these and of the transcoders package's errors
(`transcoders.errors.TranscoderError` derives from it), so `except AttrgraphError` catches every
user mistake either package reports. Each class also derives from the built-in exception it
refines (ValueError, OSError, FileNotFoundError), so code that catches those keeps working.
All are exported from `attrgraph` (and the transcoders ones from `transcoders`). The root itself is
defined in `transcoders.errors` (the lower package, which imports nothing from attrgraph) and
re-exported here; importing it loads neither torch nor the transcoder classes.
"""

from transcoders.errors import AttrgraphError
from transcoders.errors import ModelNameWarning as ModelNameWarning  # warned by sites.check_fits (step 5)
from transcoders.errors import ModelStateError as ModelStateError  # raised by both packages (model_state.py)


class ModelNotFoundError(AttrgraphError, FileNotFoundError):
    """A model name or path that names nothing loadable."""


class ChecksumError(AttrgraphError):
    """A bundled file whose sha256 differs from its manifest."""


class CorruptWeightsError(AttrgraphError):
    """A weights file that is truncated, unreadable or of the wrong shapes."""


class PromptError(AttrgraphError, ValueError):
    """A prompt that is empty, too long, or otherwise unusable."""


class PromptWarning(UserWarning):
    """A prompt that runs but may not say what was meant: unknown words, or cut to the context."""


class GraphError(AttrgraphError, ValueError):
    """A graph whose arrays break the documented layout (shapes, node order)."""


class GraphFileError(AttrgraphError, OSError):
    """A graph file that is missing, not HDF5, truncated, or lacks the graph asked for."""


class GraphReplacedWarning(UserWarning):
    """A write that will replace a graph of the same name already in the output file."""


class ExportError(AttrgraphError, ValueError):
    """An export that cannot be written: an output folder that is a file, a slug that is no plain name."""


class ExportWarning(UserWarning):
    """An export that is written but lacks something: feature files without dashboard examples."""


class SchemaVersionError(GraphFileError):
    """A graph file written with a storage schema this version cannot read."""


class UnsupportedModelError(AttrgraphError, ValueError):
    """A model the engine cannot represent exactly (a logit soft-cap) or a component graph does not cover (parallel blocks, ALiBi, ...)."""


class TargetError(AttrgraphError, ValueError):
    """An attribution target that names an unknown token, hook or position."""


class OptionError(AttrgraphError, ValueError):
    """An option that does not apply to the method asked for, or an impossible option value."""


class SupernodeError(AttrgraphError, ValueError):
    """A supernode that names nodes a graph does not hold, or an empty or overlapping grouping."""


class ViewError(AttrgraphError, ValueError):
    """A shared link (a Neuronpedia graph URL, or a graph JSON's qParams) that cannot be read against
    the graph given: malformed, or showing another prompt or model."""


class ValidationError(AttrgraphError, ValueError):
    """A graph that cannot be validated with the given model and transcoders."""


class QKError(AttrgraphError, ValueError):
    """A head or position pair that does not exist in this model and prompt."""


class InterventionError(AttrgraphError, ValueError):
    """An intervention that names no node of this model and prompt, or an unusable value or range."""


class PairLengthError(AttrgraphError, ValueError):
    """A corrupted prompt whose length differs from its clean pair."""


class ConstantMetricError(AttrgraphError, ValueError):
    """A metric that takes the same value whatever the model does, so no edge can matter."""


class ClusterError(AttrgraphError, ConnectionError):
    """Ray that is not installed, or a Ray cluster address that cannot be reached."""


class ResumeError(AttrgraphError, ValueError):
    """A graph already in a build-many output that was built from another prompt, target, option or set."""


class OutputBusyError(AttrgraphError, OSError):
    """An output file that another build-many run is writing."""


class SparsityError(AttrgraphError, ValueError):
    """A target sparsity (or kept fraction) outside the open interval (0, 1)."""


class SchemaError(AttrgraphError, ValueError):
    """A dataset schema that does not fit its examples (missing spans, overlaps, bad positions)."""


class ServeError(AttrgraphError, OSError):
    """A viewer server that cannot start: its port is taken, or its address cannot be bound."""


class CircuitMethodError(AttrgraphError, ValueError):
    """A circuit-finding method or task name that does not exist."""


class NonFiniteValueError(AttrgraphError, FloatingPointError):
    """NaN or inf in a forward's activations, errors or logits, or in a graph's edges."""


class LabelError(AttrgraphError, ValueError):
    """A feature label the viewer cannot save: no such feature in the graph, or no dashboards file to hold it."""


class ViewRequestError(AttrgraphError, ValueError):
    """A viewer request for a model panel (global connections, head loadings) with bad parameters,
    or for a graph whose model and transcoders the server cannot name."""
