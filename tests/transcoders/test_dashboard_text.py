"""`dashboard_text`: a hand-built dashboard and the exact lines expected from it."""

from transcoders import dashboard_text


def feature(**kw):
    d = {
        "layer": 2,
        "feature": 17,
        "label": '"Mary" -> Mary',
        "frequency": 0.0123,
        "max": 1.5,
        "top": [
            {"act": 1.5, "tokens": ["When", "Mary", "and"], "acts": [0.0, 1.5, 0.25], "center": 1},
            {"act": 0.75, "tokens": ["to", "Anna"], "acts": [0.0, 0.75], "center": 1},
        ],
        "top_logits": [(" Mary", 2.5), (" Anna", 1.0)],
        "bottom_logits": [(" the", -3.0)],
    }
    d.update(kw)
    return d


def test_header_examples_and_logits():
    assert dashboard_text(feature()).splitlines() == [
        """L2/F17  '"Mary" -> Mary'  active on 1.23% of tokens, max 1.5""",
        "      1.5  When [Mary]:1.5 and:0.25",
        "     0.75  to [Anna]:0.75",
        "  logits up:  Mary +2.50,  Anna +1.00 | down:  the -3.00",
    ]


def test_limits_and_name():
    lines = dashboard_text(feature(), n_examples=1, n_logits=1, name="A2/F17@14").splitlines()
    assert lines[0].startswith("A2/F17@14  ") and len(lines) == 3
    assert lines[-1] == "  logits up:  Mary +2.50 | down:  the -3.00"


def test_no_logits_no_logit_line():
    assert len(dashboard_text(feature(top_logits=[], bottom_logits=[])).splitlines()) == 3
