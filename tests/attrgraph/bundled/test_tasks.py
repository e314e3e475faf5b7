"""Property tests: every generated instance is well-formed and its graded answers are correct."""

import random

import pytest

from attrgraph.bundled import tasks

N = 300


def test_vocabulary_covers_every_generated_token():
    vocab = set(tasks.vocabulary())
    rng = random.Random(0)
    for task, gen in tasks.GENERATORS.items():
        for _ in range(N):
            ex = gen(rng)
            assert set(ex.tokens) <= vocab, task
            if ex.corrupt:
                assert set(ex.corrupt) <= vocab, task


@pytest.mark.parametrize("task", tasks.TASKS)
def test_generate_is_reproducible_and_graded_positions_are_valid(task):
    a, b = tasks.generate(task, 50, seed=3), tasks.generate(task, 50, seed=3)
    assert a == b
    assert tasks.generate(task, 50, seed=4) != a
    for ex in a:
        assert all(0 < g < len(ex.tokens) for g in ex.graded)


def test_induction_second_half_repeats_first():
    for ex in tasks.generate("induction", N):
        n = ex.meta["n"]
        assert ex.tokens[:n] == ex.tokens[n:]
        assert ex.graded == tuple(range(n + 1, 2 * n))


def test_ioi_answer_is_the_indirect_object_and_corruption_replaces_s2():
    for ex in tasks.generate("ioi", N):
        io, s, c = ex.meta["io"], ex.meta["s"], ex.meta["c"]
        assert len({io, s, c}) == 3
        assert ex.answer == io and ex.graded == (len(ex.tokens) - 1,)
        prompt = ex.tokens[: ex.graded[0]]
        assert prompt.count(io) == 1 and prompt.count(s) == 2
        assert len(ex.corrupt) == len(ex.tokens)
        diff = [i for i, (x, y) in enumerate(zip(ex.tokens, ex.corrupt)) if x != y]
        assert diff == [ex.meta["s2_pos"]] and ex.corrupt[diff[0]] == c
        first = min(prompt.index(io), prompt.index(s))
        assert (prompt[first] == io) == (ex.meta["order"] == "ABBA")


def test_ioi_uses_all_fifteen_templates_in_both_orders():
    seen = {(ex.meta["template"], ex.meta["order"]) for ex in tasks.generate("ioi", 2000)}
    assert len(seen) == 30


def test_greater_than_answer_is_later_and_counterfactual_is_01():
    for ex in tasks.generate("greater_than", N):
        yy = ex.meta["yy"]
        assert int(ex.answer) > yy and ex.answer in ex.valid
        assert set(ex.valid) == {f"{z:02d}" for z in range(yy + 1, 100)}
        assert ex.corrupt[7] == "01" and ex.tokens[7] == f"{yy:02d}"
        assert ex.tokens[6] == ex.tokens[11] == "17"


def test_brackets_tail_closes_the_stack_in_order():
    for ex in tasks.generate("brackets", N):
        bar = ex.tokens.index("|")
        stack = []
        for t in ex.tokens[:bar]:
            if t in tasks.OPEN_CLOSE:
                stack.append(t)
            else:
                assert tasks.OPEN_CLOSE[stack.pop()] == t
        tail = [tasks.OPEN_CLOSE[b] for b in reversed(stack)] + ["."]
        assert list(ex.tokens[bar + 1 :]) == tail and ex.graded == tuple(range(bar + 1, len(ex.tokens)))


def test_addition_digits_spell_the_sum():
    for ex in tasks.generate("addition", N):
        eq = ex.tokens.index("=")
        a, b = ex.meta["a"], ex.meta["b"]
        assert "".join(ex.tokens[:eq]) == f"{a}+{b}"
        assert "".join(ex.tokens[g] for g in ex.graded) == str(a + b)


def test_facts_are_capitals():
    for ex in tasks.generate("facts", N):
        assert ex.answer == tasks.CAPITALS[ex.meta["country"]]


def test_stream_mixes_every_task():
    stream = tasks.stream(seed=1)
    seen = {next(stream).task for _ in range(500)}
    assert seen == set(tasks.TASKS)


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task"):
        tasks.generate("sorting", 1)
