"""The bundled model: its task corpus, tokenizer, training, evaluation and loading.

tasks.py        the generated corpus of tasks with known mechanisms
task_eval.py    held-out metrics per task
tokenizer.py    the word-level tokenizer
train_model.py  `python -m attrgraph.bundled.train_model`
loading.py      `load_model`: bundled, local folder or TransformerLens name
paths.py        where the bundled artefacts live

Importing this package registers its model loader and its corpus "bundled" with
`transcoders.providers` (as the entry points in pyproject.toml do for `python -m transcoders.train`).
"""

from transcoders import providers


def _load_model(name, device="cpu"):
    from attrgraph.bundled.loading import load_model

    return load_model(name, device=device)


def _corpus(seed: int):
    from attrgraph.bundled.tasks import corpus

    return corpus(seed)


# what pyproject.toml's entry points give transcoders (transcoders/providers.py), also when this
# package is used without (re)installing it, once it is imported
providers.register_model_loader(_load_model)
providers.register_corpus("bundled", _corpus)
