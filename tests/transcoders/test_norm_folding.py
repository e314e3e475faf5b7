"""A set records whether its model's norms were folded (sites.py step 4; docs/bad_inputs.md, round 9).

TransformerLens's `from_pretrained` folds the norms' weights into the next layer by default (and
centers the writing weights); circuit-tracer, GemmaScope and sae_lens load their models without that
processing. The two models compute the same function but hand an MLP other inputs, so a set on the
other kind read other vectors, without a word: on the bundled model the IOI graph's replacement score
fell from 0.94 to 0.85. The expected values come from TransformerLens itself (the processed model's
logits, its MLP inputs) and from sae_lens's own objects."""

import copy

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tests.transcoders.tc_helpers import random_set, tiny_model
from tests.transcoders.test_train import small_cfg
from transcoders import TranscoderMismatchError, UnknownFormatError, load_transcoders, save_transcoders
from transcoders.sites import check_fits, collect, norms_folded
from transcoders.train import transcoder_config

TOKENS = torch.tensor([[0, 5, 9, 3, 17, 22, 5, 8]])


@pytest.fixture(scope="module")
def models():
    plain = tiny_model()
    processed = copy.deepcopy(plain)
    processed.process_weights_()  # fold_ln, center_writing_weights, center_unembed: from_pretrained's
    return plain, processed


def test_processing_keeps_the_function_but_not_the_mlp_input(models):
    """Why the record is needed: TransformerLens's processing leaves the next-token distribution as it
    was, and changes what every MLP reads (`normalized * w + b` becomes `normalized`)."""
    plain, processed = models
    assert (norms_folded(plain), norms_folded(processed)) == (False, True)
    with torch.no_grad():
        a, b = plain(TOKENS).log_softmax(-1), processed(TOKENS).log_softmax(-1)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    cfg = random_set().cfg
    x_plain, _ = collect(plain, TOKENS, cfg)
    x_processed, _ = collect(processed, TOKENS, cfg)
    assert (x_plain - x_processed).abs().max() > 0.1


def test_a_set_is_used_only_on_a_model_processed_as_it_was_trained(models):
    plain, processed = models
    unfolded, folded, unknown = (random_set(folded_norms=v) for v in (False, True, None))
    with pytest.raises(TranscoderMismatchError) as e:
        check_fits(processed, unfolded)
    assert str(e.value) == (
        "the transcoders were trained on the model with its norms unfolded, but this one has them folded "
        "(normalization_type 'LNPre'): they would read other inputs than they were trained on; load it "
        "without weight processing: attrgraph.load_model(name) (HookedTransformer.from_pretrained_no_processing, "
        "as circuit-tracer does)."
    )
    with pytest.raises(
        TranscoderMismatchError, match=r"norms folded, but this one has them unfolded .*processing=True"
    ):
        check_fits(plain, folded)
    for model, tc in ((plain, unfolded), (processed, folded), (plain, unknown), (processed, unknown)):
        check_fits(model, tc)


def test_training_records_how_its_model_was_processed(models, tmp_path):
    plain, processed = models
    assert transcoder_config(small_cfg(tmp_path), plain).folded_norms is False
    assert transcoder_config(small_cfg(tmp_path), processed).folded_norms is True


def test_formats_record_it(tmp_path):
    """circuit-tracer and GemmaScope load their models unprocessed: their sets say so, and a set trained
    on a processed model is not written there; sae_lens keeps it in `model_from_pretrained_kwargs`."""
    save_transcoders(random_set(), tmp_path / "ct", format="circuit-tracer")
    assert load_transcoders(tmp_path / "ct").cfg.folded_norms is False
    save_transcoders(random_set(activation="jumprelu"), tmp_path / "gs", format="gemmascope")
    assert load_transcoders(tmp_path / "gs", format="gemmascope").cfg.folded_norms is False
    for fmt in ("circuit-tracer", "gemmascope"):
        with pytest.raises(UnknownFormatError, match="folded"):
            save_transcoders(random_set(folded_norms=True), tmp_path / f"no-{fmt}", format=fmt)
    for value in (True, False, None):
        save_transcoders(random_set(folded_norms=value), tmp_path / f"sl-{value}", format="sae-lens")
        assert load_transcoders(tmp_path / f"sl-{value}", format="sae-lens").cfg.folded_norms is value


@pytest.mark.parametrize(
    "kwargs, recorded",
    [
        ({"fold_ln": False}, False),
        ({"fold_ln": True}, True),
        ({"center_writing_weights": False}, None),
        (None, None),
    ],
)
def test_sae_lens_metadata_says_it_when_it_names_fold_ln(kwargs, recorded):
    """sae_lens's own objects: `fold_ln` in `model_from_pretrained_kwargs` is what its model was loaded
    with; without it the model's processing depends on the sae_lens version that trained it."""
    import warnings

    saes = []
    for layer in range(2):
        meta = SAEMetadata(hook_name=f"blocks.{layer}.hook_attn_out", model_from_pretrained_kwargs=kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # sae_lens's "load the model like so" advice
            saes.append(StandardSAE(StandardSAEConfig(d_in=16, d_sae=24, metadata=meta)))
    assert load_transcoders(saes).cfg.folded_norms is recorded
