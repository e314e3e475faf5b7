"""The word-level tokenizer: pieces, round trips, and use through TransformerLens."""

import pytest

from attrgraph.bundled import tasks
from attrgraph.bundled.tokenizer import SPECIALS, build_tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tasks.vocabulary(), tmp_path_factory.mktemp("tok"))


def test_specials_come_first(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(s) for s in SPECIALS] == [0, 1, 2, 3]
    assert tokenizer.bos_token_id == 0


def test_years_split_into_two_digit_pieces_and_punctuation_is_separate(tokenizer):
    ids = tokenizer("The war lasted from the year 1732 to the year 17").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "<bos>",
        "The",
        "war",
        "lasted",
        "from",
        "the",
        "year",
        "17",
        "32",
        "to",
        "the",
        "year",
        "17",
    ]
    assert tokenizer.convert_ids_to_tokens(tokenizer("store, John").input_ids)[1:] == ["store", ",", "John"]


@pytest.mark.parametrize("task", tasks.TASKS)
def test_round_trip_on_every_task(tokenizer, task):
    for ex in tasks.generate(task, 50):
        ids = tokenizer(ex.text, add_special_tokens=False).input_ids
        assert tokenizer.convert_ids_to_tokens(ids) == list(ex.tokens)
        assert tokenizer.decode(ids) == ex.text


def test_unknown_words_map_to_unk(tokenizer):
    ids = tokenizer("Zyzzyva", add_special_tokens=False).input_ids
    assert ids == [tokenizer.unk_token_id]


def test_reload_and_transformer_lens(tokenizer, tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tokenizer.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    cfg = HookedTransformerConfig(
        n_layers=1,
        d_model=16,
        n_heads=2,
        d_head=8,
        d_vocab=len(tok),
        n_ctx=16,
        act_fn="gelu",
        normalization_type="LN",
        d_mlp=32,
    )
    model = HookedTransformer(cfg, tokenizer=tok)
    assert model.to_str_tokens("Mary and John") == ["<bos>", "Mary", "and", "John"]
    assert model.to_single_token(" Mary") == tok.convert_tokens_to_ids("Mary")
