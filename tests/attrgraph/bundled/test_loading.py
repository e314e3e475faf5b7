"""load_model: the bundled model offline, local folders, and each bad input's error."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import save_file

from attrgraph import ChecksumError, CorruptWeightsError, ModelNotFoundError, load_model, load_model_config
from attrgraph.bundled.paths import BUNDLED
from transcoders.manifest import sha256

TINY = dict(
    n_layers=1,
    d_model=16,
    n_heads=2,
    d_head=8,
    d_mlp=32,
    d_vocab=20,
    n_ctx=16,
    act_fn="gelu",
    normalization_type="LN",
    tokenizer_name=None,
)
needs_bundled = pytest.mark.bundled("default")  # fails, never skips, when data/default is missing


@pytest.fixture
def tiny_folder(tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**TINY))
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "model.safetensors")
    manifest = {"files": {"model.safetensors": sha256(tmp_path / "model.safetensors")}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path, model


def test_local_folder_round_trip(tiny_folder):
    folder, model = tiny_folder
    loaded = load_model(folder)
    tokens = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded(tokens), model(tokens))


def test_float64(tiny_folder):
    folder, _ = tiny_folder
    assert load_model(folder, dtype=torch.float64).W_E.dtype == torch.float64


def test_unknown_name():
    with pytest.raises(ModelNotFoundError, match="TransformerLens model"):
        load_model("no-such-model-xyz")


def test_unknown_name_is_one_line_with_a_few_close_names():
    """Not TransformerLens' 7 KB list of every official name: at most three close ones."""
    with pytest.raises(ModelNotFoundError) as e:
        load_model("pythia-70")
    assert str(e.value) == (
        "'pythia-70' is not 'default', a model folder, or a TransformerLens model name; "
        "did you mean 'pythia-70m' or 'pythia-v0' or 'pythia-800m'?"
    )
    with pytest.raises(ModelNotFoundError, match=r"name; see transformer_lens\.loading_from_pretrained"):
        load_model("qwerty")


def test_missing_folder_and_missing_file(tiny_folder, tmp_path_factory):
    with pytest.raises(ModelNotFoundError, match="no model folder"):
        load_model("./does/not/exist")
    folder, _ = tiny_folder
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="model.safetensors"):
        load_model(folder)


def test_checksum_mismatch(tiny_folder):
    folder, _ = tiny_folder
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="sha256"):
        load_model(folder)


def test_truncated_weights(tiny_folder):
    folder, _ = tiny_folder
    (folder / "manifest.json").unlink()
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptWeightsError, match="truncated"):
        load_model(folder)


FIELDS = (
    "n_layers",
    "d_model",
    "n_heads",
    "d_head",
    "d_mlp",
    "d_vocab",
    "n_ctx",
    "act_fn",
    "normalization_type",
)


def test_the_config_alone_of_a_folder_whose_weights_are_not_read(tiny_folder):
    """load_model_config reads config.json only: with the weights cut in half (load_model refuses
    them) it still gives the config the model was built with."""
    folder, model = tiny_folder
    (folder / "manifest.json").unlink()
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptWeightsError, match="truncated"):
        load_model(folder)
    cfg = load_model_config(folder)
    assert {f: getattr(cfg, f) for f in FIELDS} == {f: getattr(model.cfg, f) for f in FIELDS}


GPT2_CONFIG = {  # huggingface.co/gpt2/config.json, as published
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257,
}  # fmt: skip


def test_the_config_of_a_transformer_lens_name_from_the_cache_alone(tmp_path, monkeypatch):
    """A TransformerLens name: its config from the Hugging Face config in the cache (offline), no
    weights there at all. Expected: GPT-2 small's published shape (12 layers of 12 heads of 64,
    d_model 768, d_mlp 4 x 768, 50,257 tokens, 1,024 positions)."""
    import huggingface_hub.constants as hf

    cache = tmp_path / "hub"
    snapshot = cache / "models--gpt2" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(GPT2_CONFIG))
    (cache / "models--gpt2" / "refs").mkdir()
    (cache / "models--gpt2" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_model_config("gpt2")
    assert {f: getattr(cfg, f) for f in FIELDS} == dict(
        n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, d_vocab=50257, n_ctx=1024,
        act_fn="gelu_new", normalization_type="LN",
    )  # fmt: skip
    with pytest.raises(
        ModelNotFoundError, match=r"could not read the config of TransformerLens model 'gpt2-medium'"
    ) as e:
        load_model_config("gpt2-medium")  # not in the cache
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "spec, says",
    [
        (3, "the model is named by a int"),
        ("gtp2", "'gtp2' is not 'default', a model folder, or a TransformerLens model name; did you mean"),
        ("./no/such/folder", "no model folder at no/such/folder"),
    ],
)
def test_a_config_that_cannot_be_read_is_one_line(spec, says, tmp_path):
    with pytest.raises(ModelNotFoundError) as e:
        load_model_config(spec)
    assert says in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        load_model_config(tmp_path)


def test_weights_of_the_wrong_shape(tiny_folder):
    folder, _ = tiny_folder
    (folder / "config.json").write_text(json.dumps(TINY | {"d_mlp": 48}))
    with pytest.raises(CorruptWeightsError, match="does not fit"):
        load_model(folder)


@needs_bundled
def test_bundled_model_loads_offline_with_its_tokenizer():
    model = load_model("default")
    assert model.cfg.n_layers == 4
    assert model.to_str_tokens("When Mary and John went to the store")[:3] == ["<bos>", "When", "Mary"]


@needs_bundled
def test_bundled_model_reproduces_manifest_metrics():
    from attrgraph.bundled.task_eval import QUALITY_BAR, evaluate_tasks

    manifest = json.loads((BUNDLED["default"] / "manifest.json").read_text())
    metrics = evaluate_tasks(load_model("default"), n=100)
    for key in QUALITY_BAR:
        ref = manifest["metrics"][key]
        tol = 0.1 * max(1.0, abs(ref)) if key == "ioi_logit_diff" else 0.06
        assert abs(metrics[key] - ref) <= tol, (key, metrics[key], ref)


@needs_bundled
def test_bundled_checksums_are_checked(tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(BUNDLED["default"], folder)
    with open(folder / "config.json", "a") as f:
        f.write(" ")
    with pytest.raises(ChecksumError):
        load_model(folder)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"files": 3}'])
def test_damaged_manifest(tiny_folder, text):
    folder, _ = tiny_folder
    (folder / "manifest.json").write_text(text)
    with pytest.raises(ChecksumError, match="is not a JSON manifest"):
        load_model(folder)


def test_missing_bundled_data_fails_and_says_where(tmp_path, bundled_check):
    """The `bundled` marker's check: a test of the shipped data fails (never skips) when it is gone."""

    def outcome(folder):
        with pytest.raises(BaseException) as e:  # BaseException: pytest's skip and fail outcomes too
            bundled_check(["default"], {"default": folder})
        assert e.type is pytest.fail.Exception, e.type  # a failure, not a skip
        return str(e.value)

    gone = tmp_path / "default"
    assert re.fullmatch(
        r"bundled data missing at .*default/manifest\.json; .*git checkout -- data/.*", outcome(gone)
    )
    shutil.copytree(BUNDLED["default"], gone)
    bundled_check(["default"], {"default": gone})  # complete: passes
    (gone / "tokenizer" / "tokenizer.json").unlink()
    assert re.match(r"bundled data missing at .*default/tokenizer/tokenizer\.json;", outcome(gone))


def test_bundled_marker_fails_before_fixtures_load(pytester, monkeypatch, tmp_path, request):
    """End to end: with data/default gone, a marked test errors at setup with the message (no skip),
    before its fixture would have tried to load the model."""
    conftest = next(p for p in request.config.pluginmanager.get_plugins() if hasattr(p, "require_bundled"))
    monkeypatch.setitem(BUNDLED, "default", tmp_path / "gone")
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def model():
            raise AssertionError("the fixture ran")

        @pytest.mark.bundled("default")
        def test_needs_it(model):
            pass

        def test_other():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", plugins=[conftest])
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*bundled data missing at *gone/manifest.json; *do not skip*"])
    result.stdout.no_fnmatch_line("*the fixture ran*")


def test_a_device_this_machine_lacks_is_one_sentence_before_loading():
    """`load_model(..., device=...)` checks the device first (the CLI's `--device` goes through it)."""
    from attrgraph import AttrgraphError

    with pytest.raises(AttrgraphError, match="'gpu' is not a torch device; pass cpu, cuda, cuda:N or mps"):
        load_model("no-such-model-folder/", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(AttrgraphError, match="CUDA is not available on this machine"):
            load_model("default", device="cuda")
    assert load_model("default", device="cpu").cfg.device == "cpu"


# --------------------------------------------- bad input round 7: a model folder's damaged files
def _without_manifest(folder):
    (folder / "manifest.json").unlink()  # an edited folder, as a user's own or a converted one is
    return folder


@pytest.mark.parametrize(
    "text, pattern",
    [
        (b"{", r"config\.json is not valid JSON: .* at line 1, column 2"),
        (b'{"a": "\xff"}', r"config\.json is not UTF-8 text \(byte 7\)"),
        (b"[1, 2]", r"config\.json holds a JSON list, not an object of HookedTransformerConfig fields\."),
    ],
)
def test_a_config_json_that_is_no_config(tiny_folder, text, pattern):
    folder = _without_manifest(tiny_folder[0])
    (folder / "config.json").write_bytes(text)
    with pytest.raises(CorruptWeightsError, match=pattern):
        load_model(folder)


@pytest.mark.parametrize(
    "change, pattern",
    [
        ({"colour": 1}, r"unexpected keyword argument 'colour'"),
        ({"n_layers": "x"}, r"'str' object cannot be interpreted as an integer"),
        ({"act_fn": "bogus"}, r"act_fn=bogus must be one of \{'solu': solu, "),  # names, not reprs
        ({"normalization_type": "bogus"}, r"Invalid normalization_type passed in: bogus"),
        (
            {"positional_embedding_type": "bogus"},
            r"positional_embedding_type 'bogus' is not one of \('standard'",
        ),
    ],
)
def test_a_config_transformer_lens_cannot_build_names_the_file(tiny_folder, change, pattern):
    """Each raised TransformerLens' own TypeError, AssertionError or ValueError; the last loaded and
    failed in the first forward."""
    folder = _without_manifest(tiny_folder[0])
    (folder / "config.json").write_text(json.dumps(TINY | change))
    with pytest.raises(CorruptWeightsError, match=r"config\.json does not make a HookedTransformer \(") as e:
        load_model(folder)
    assert re.search(pattern, str(e.value)) and "\n" not in str(e.value)


def test_integer_weights_are_refused_not_cast(tiny_folder):
    folder, model = tiny_folder
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["embed.W_E"] = (state["embed.W_E"] * 100).long()
    save_file(state, _without_manifest(folder) / "model.safetensors")
    with pytest.raises(
        CorruptWeightsError, match=r"embed\.W_E holds int64 values where the model has floats"
    ):
        load_model(folder)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_when_loaded(tiny_folder, bad):
    """Before, the model loaded and every graph of it failed later, on its logits, without naming
    the tensor; a finite folder (the round trip above) still loads."""
    from attrgraph.errors import NonFiniteValueError

    folder, model = tiny_folder
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["blocks.0.mlp.W_in"][1, :2] = bad
    save_file(state, _without_manifest(folder) / "model.safetensors")
    with pytest.raises(
        NonFiniteValueError, match=r"blocks\.0\.mlp\.W_in holds 2 of 512 values that are NaN or inf"
    ):
        load_model(folder)


@pytest.mark.parametrize("damage", ["empty", "garbage"])
def test_a_tokenizer_folder_transformers_cannot_read(tiny_folder, damage):
    folder = _without_manifest(tiny_folder[0])
    (folder / "tokenizer").mkdir()
    if damage == "garbage":
        (folder / "tokenizer" / "tokenizer.json").write_text("garbage{")
    with pytest.raises(CorruptWeightsError, match=r"tokenizer holds no tokenizer transformers can read \("):
        load_model(folder)
