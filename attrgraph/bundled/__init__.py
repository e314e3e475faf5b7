"""The bundled model: its task corpus, tokenizer, training, evaluation and loading.

tasks.py        the generated corpus of tasks with known mechanisms
task_eval.py    held-out metrics per task
tokenizer.py    the word-level tokenizer
train_model.py  `python -m attrgraph.bundled.train_model`
loading.py      `load_model`: bundled, local folder or TransformerLens name
paths.py        where the bundled artefacts live
"""
