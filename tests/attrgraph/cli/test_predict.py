"""`attrgraph predict`: the top next-token probabilities, on a model whose answer is known by construction."""

import json

import pytest
import torch
from safetensors.torch import save_file

from attrgraph.bundled.loading import load_model
from attrgraph.bundled.tokenizer import SPECIALS, build_tokenizer
from attrgraph.cli import main
from attrgraph.cli.predict import top_predictions
from attrgraph.errors import PromptError

WORDS = ["Mary", "John", "store", "went", "to", "the"]
# next-token distribution of the model below, after any prompt
WANT = {"Mary": 0.4, "John": 0.25, "store": 0.15}
REST = (1 - sum(WANT.values())) / (len(SPECIALS) + len(WORDS) - len(WANT))


@pytest.fixture(scope="module")
def known_folder(tmp_path_factory):
    """A model folder whose every weight is zero except the unembedding bias `b_U = log p + 3`: the
    residual stream is 0, so the final LayerNorm gives 0 and the logits are `b_U` at every position."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    folder = tmp_path_factory.mktemp("known")
    tok = build_tokenizer(WORDS, folder / "tokenizer")
    vocab = tok.get_vocab()
    cfg = dict(
        n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=len(vocab), n_ctx=16,
        act_fn="gelu", normalization_type="LN", tokenizer_name=None, default_prepend_bos=True,
    )  # fmt: skip
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    p = torch.full((len(vocab),), REST)
    for word, prob in WANT.items():
        p[vocab[word]] = prob
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.b_U.copy_(p.log() + 3.0)  # logits are log p up to a constant
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    return folder


def test_top_predictions_are_the_known_distribution(known_folder):
    model = load_model(known_folder)
    top = top_predictions(model, "Mary went to the store", k=4)
    assert [t for t, _ in top[:3]] == list(WANT)
    assert [p for _, p in top] == pytest.approx([*WANT.values(), REST], abs=1e-6)
    # k beyond the vocabulary gives every token once, probabilities summing to 1
    every = top_predictions(model, "John", k=1000)
    assert len(every) == len(SPECIALS) + len(WORDS) and sum(p for _, p in every) == pytest.approx(1.0)


def test_cli_prints_the_known_lines(known_folder, capsys):
    assert main(["predict", "the store", "--model", str(known_folder), "-k", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == ["  0.400  'Mary'", "  0.250  'John'", "  0.150  'store'"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["   "], "prompt is empty; pass at least one token of text"),
        ([" ".join(["the"] * 16)], "prompt has 17 tokens but the model's context is 16; shorten it"),
        (["the", "-k", "0"], "argument -k: '0' is not a whole number of 1 or more"),
        (["the", "-k", "two"], "argument -k: 'two' is not a whole number of 1 or more"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(known_folder, capsys, argv, words):
    try:
        code = main(["predict", *argv, "--model", str(known_folder)])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err


def test_top_predictions_refuses_empty_and_long_prompts(known_folder):
    model = load_model(known_folder)
    with pytest.raises(PromptError, match="prompt is empty"):
        top_predictions(model, "")
    with pytest.raises(PromptError, match="context is 16"):
        top_predictions(model, " ".join(["the"] * 16))


@pytest.mark.bundled("default")
def test_bundled_model_names_the_indirect_object(capsys):
    """The bundled model's IOI behaviour (attrgraph.tasks): the name not repeated comes next."""
    assert main(["predict", "When Mary and John went to the store , John gave a drink to", "-k", "1"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith("'Mary'") and float(line.split()[0]) > 0.9
