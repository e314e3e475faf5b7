"""The provenance fingerprint: equal for equal weights, different when a weight or a shape differs."""

import torch

from transcoders.fingerprint import fingerprint


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


def test_fingerprint_is_the_stored_graphs_hash_read_in_one_copy(monkeypatch):
    """Graphs and dashboards saved before record this hash: sha256 over each tensor's name, shape and
    every (numel // 4096)-th value as float64, in name order. It is read from the device in one copy."""
    import hashlib

    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(300, 50), torch.nn.LayerNorm(50), torch.nn.Embedding(99, 7))
    module.register_buffer("steps", torch.arange(5))
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode() + str(tuple(p.shape)).encode())
        h.update(p.reshape(-1)[:: max(1, p.numel() // 4096)].double().numpy().tobytes())
    copies = []
    original = torch.Tensor.cpu
    monkeypatch.setattr(
        torch.Tensor, "cpu", lambda self, *a, **k: copies.append(1) or original(self, *a, **k)
    )
    assert fingerprint(module) == h.hexdigest()[:16] and len(copies) == 1
