"""The bundled model's word-level tokenizer, built locally with `tokenizers`.

1. Split on whitespace, then into words, two-digit chunks ("1732" -> "17", "32"),
   single digits, and single punctuation marks.
2. Map each piece to its id in a fixed vocabulary (specials first); unknown
   pieces become <unk>.
3. Wrap it as a Hugging Face `PreTrainedTokenizerFast`, saved to a folder, so that
   TransformerLens tokenizes strings with it (`model.to_tokens("...")`) offline.
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ("<bos>", "<eos>", "<pad>", "<unk>")
PIECES = r"\d\d|\d|[A-Za-z_]+|[^\sA-Za-z_\d]"


def build_tokenizer(words: list[str], save_dir: str | Path):
    """Create, save and reload the tokenizer for `words` (ids follow the specials, in order)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(PIECES), behavior="isolated")]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins pieces with spaces
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=True,
    )
    hf.save_pretrained(str(save_dir))
    return load_tokenizer(save_dir)


def load_tokenizer(path: str | Path):
    """Reload a saved tokenizer from a local folder (never the hub).

    A local `name_or_path` and `add_bos_token=True` keep TransformerLens from
    looking the tokenizer up on the hub when it checks for a BOS token.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
