"""The provenance fingerprint: equal for equal weights, different when a weight or a shape differs."""

import torch

from attrgraph.graph.fingerprint import fingerprint


def test_fingerprint_follows_the_weights():
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4)
    b = torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    assert fingerprint(a) == fingerprint(b) and len(fingerprint(a)) == 16
    with torch.no_grad():
        b.weight[0, 0] += 1.0  # a sampled value (the first of each parameter always is)
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(torch.nn.Linear(4, 8)) != fingerprint(a)
