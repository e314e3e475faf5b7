"""Every path runs with the model and transcoders on one device, without host/device mixing.

Two checks, both useful on a machine without a GPU:
1. Static: in the modules that compute on the model's device, every tensor factory names its
   device (`device=`), and `.numpy()` is only called on a `.cpu()` result (a CUDA tensor has no
   numpy view). Deliberate host tensors say `device="cpu"`.
2. Dynamic: attribution (three methods, both backends), pruning, interventions, validation, QK,
   circuits (EAP, PEAP, faithfulness, Edge Pruning) and a training step run with the model on
   `device` (cpu; cuda where present) while tensors made without `device=` land elsewhere
   (tests/conftest.py `foreign_default_device`), and give the same results as a plain CPU run.
"""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (
    sorted((ROOT / "attrgraph" / "engine").glob("*.py"))
    + sorted((ROOT / "attrgraph" / "analysis").glob("*.py"))
    + sorted((ROOT / "attrgraph" / "circuits").glob("*.py"))
    + [
        ROOT / "transcoders" / n
        for n in (
            "train.py",
            "train_config.py",
            "trainer.py",
            "metrics.py",
            "distributed.py",
            "nonlinearity.py",
        )
    ]
)
FACTORIES = {
    "zeros", "ones", "empty", "full", "arange", "tensor", "as_tensor", "eye", "rand", "randn",
    "randint", "randperm", "linspace", "logspace", "Generator",
}  # fmt: skip
# (file, text of the call): factories that are host-side on purpose
ALLOWED = {
    # the initialization is drawn on the host, so that a seed gives one set whatever the device
    ("transcoders/trainer.py", "torch.Generator()"),
    # a set's threshold is made with the set, on the host, and moved with it (`.to(device)`)
    ("transcoders/nonlinearity.py", "torch.full((n_layers, d_sae), THRESHOLD_INIT)"),
    ("transcoders/nonlinearity.py", "torch.zeros(n_layers, d_sae)"),
}


def _offences(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    text = path.read_text()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        call = ast.get_source_segment(text, node) or ""
        if (
            isinstance(f.value, ast.Name)
            and f.value.id == "torch"
            and f.attr in FACTORIES
            and not any(k.arg == "device" for k in node.keywords)
            and (rel, call) not in ALLOWED
        ):
            out.append(f"{rel}:{node.lineno} {call[:80]} has no device=")
        if f.attr == "numpy" and not (
            isinstance(f.value, ast.Call)
            and isinstance(f.value.func, ast.Attribute)
            and f.value.func.attr == "cpu"
        ):
            out.append(f"{rel}:{node.lineno} {call[:80]}: call .numpy() on a .cpu() result")
    return out


def test_factories_name_their_device_and_numpy_follows_cpu():
    bad = [o for path in SCANNED for o in _offences(path)]
    assert not bad, "\n".join(bad)


def test_the_scan_sees_what_it_must_flag(tmp_path):
    """The check of test 1 itself: each kind of offence is found, and named host tensors pass."""
    path = ROOT / "attrgraph" / "engine" / "_scan_probe.py"
    try:
        path.write_text(
            "import torch\n"
            "a = torch.zeros(3)\n"
            "b = torch.arange(4, device=x.device)\n"
            "c = torch.tensor([1], device='cpu')\n"
            "d = y.numpy()\n"
            "e = y.cpu().numpy()\n"
        )
        got = _offences(path)
    finally:
        path.unlink()
    assert [o.split()[0].rsplit(":", 1)[1] for o in got] == ["2", "5"]


# ---------------------------------------------------------------------------------- dynamic
PROMPT = [1, 2, 3, 4, 5, 6, 7]


def _model(device, arch="gpt2"):
    from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

    model = tiny_model(arch, torch.float32)
    tc = tiny_transcoders(model, "clt" if arch == "llama" else "plt", skip=arch == "gpt2")
    return model.to(device), tc.to(device)


def _graphs(model, tc):
    from attrgraph.engine.attribute import attribute

    out = {}
    for backend in ("linear", "autograd"):
        out[f"standard-{backend}"] = attribute(model, tc, PROMPT, backend=backend)
        out[f"hierarchical-{backend}"] = attribute(model, tc, PROMPT, method="hierarchical", backend=backend)
        out[f"adaptive-{backend}"] = attribute(
            model, tc, PROMPT, method="adaptive", max_feature_nodes=6, batch_size=4, backend=backend
        )
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_attribution_on_device_equals_the_cpu_graph(device, foreign_default_device, arch):
    ref = _graphs(*_model("cpu", arch))
    model, tc = _model(device, arch)
    with foreign_default_device():
        got = _graphs(model, tc)
    for name, g in ref.items():
        h = got[name]
        assert h.adjacency.dtype == np.float32, name
        np.testing.assert_array_equal(h.nodes.feature, g.nodes.feature, err_msg=name)
        scale = np.abs(g.dense()).max()
        np.testing.assert_allclose(h.dense(), g.dense(), rtol=0, atol=1e-5 * scale, err_msg=name)
        np.testing.assert_allclose(h.nodes.influence, g.nodes.influence, rtol=1e-4, atol=1e-7, err_msg=name)


def test_rows_kept_on_the_device_equal_the_cpu_graph(device, foreign_default_device, monkeypatch):
    """The GPU's plan (rows resident on the device, influence solved there; linear_backward.py step 8)
    on `device`, whatever the default device: the same graph as the CPU's plan on the CPU; and the
    pruned graph `attrgraph build` makes there (pruned on the device, device_prune.py) the same as
    `prune_graph` of the CPU's graph; and an adaptive graph ranked and folded there (adaptive.py) the
    same as the CPU's plan's."""
    import attrgraph.engine.linear_backward as lb
    from attrgraph.engine.adaptive import attribute_adaptive
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.batch_plan import device_budget
    from attrgraph.engine.pruned_build import attribute_pruned
    from attrgraph.graph.prune import prune_graph

    ref = attribute(*_model("cpu", "llama"), PROMPT, backend="linear")
    adaptive = dict(max_feature_nodes=ref.n_features // 3, k=ref.n_features // 9, backend="linear")  # 3 steps
    ref_adaptive = attribute_adaptive(*_model("cpu", "llama"), PROMPT, **adaptive)
    model, tc = _model(device, "llama")
    monkeypatch.setattr(lb, "budget_for", lambda *a: device_budget(1 << 30, 1 << 20, 8))
    with foreign_default_device():
        got = attribute(model, tc, PROMPT, backend="linear")
        pruned = attribute_pruned(model, tc, PROMPT, 0.5, 0.9, backend="linear")
        got_adaptive = attribute_adaptive(model, tc, PROMPT, **adaptive)
    assert got_adaptive.meta["rows_on_device"] and not ref_adaptive.meta["rows_on_device"]
    np.testing.assert_array_equal(got_adaptive.nodes.feature, ref_adaptive.nodes.feature)
    a_scale = np.abs(ref_adaptive.dense()).max()
    np.testing.assert_allclose(got_adaptive.dense(), ref_adaptive.dense(), rtol=0, atol=1e-5 * a_scale)
    np.testing.assert_allclose(
        got_adaptive.nodes.influence, ref_adaptive.nodes.influence, rtol=1e-4, atol=1e-7
    )
    scale = np.abs(ref.dense()).max()
    np.testing.assert_allclose(got.dense(), ref.dense(), rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(got.nodes.influence, ref.nodes.influence, rtol=1e-4, atol=1e-7)
    want = prune_graph(ref, 0.5, 0.9)
    np.testing.assert_array_equal(pruned.nodes.feature, want.nodes.feature)
    np.testing.assert_array_equal(pruned.dense() != 0, want.dense() != 0)
    np.testing.assert_allclose(pruned.dense(), want.dense(), rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(pruned.nodes.influence, want.nodes.influence, rtol=1e-4, atol=1e-7)


def _analyses(model, tc, graph):
    from attrgraph.analysis.intervene import intervene
    from attrgraph.analysis.qk import qk_attribution
    from attrgraph.analysis.validate import ValidateConfig, validate_graph
    from attrgraph.graph.prune import prune_graph

    n = graph.nodes
    f = int(np.flatnonzero(n.kind == "feature")[-1])
    key = (int(n.layer[f]), int(n.position[f]), int(n.feature[f]))
    pruned = prune_graph(graph, 0.5, 0.9)
    out = {"pruned": pruned.dense(), "pruned_features": pruned.nodes.feature}
    for mode in ("constrained", "iterative"):
        run = intervene(model, tc, PROMPT, {key: 0.0}, mode=mode)
        out[f"{mode}-logits"] = run.logits.cpu().numpy()
    report = validate_graph(model, tc, graph, ValidateConfig(max_features=4, n_perturbations=2))
    out["kl"] = np.array(report["node_to_logit"]["_scatter"]["kl"])
    out["faithful"] = np.array(report["faithfulness"]["encoder"]["cosine"])
    out["qk"] = qk_attribution(model, tc, PROMPT, 1, 0, 5, 2).pairs()
    return out


def test_pruning_interventions_validation_on_device(device, foreign_default_device):
    from attrgraph.engine.attribute import attribute

    ref_model, ref_tc = _model("cpu")
    ref = _analyses(ref_model, ref_tc, attribute(ref_model, ref_tc, PROMPT))
    model, tc = _model(device)
    with foreign_default_device():
        got = _analyses(model, tc, attribute(model, tc, PROMPT))
    for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=k)


def _circuits(model, pairs):
    from attrgraph.circuits.construct import top_n
    from attrgraph.circuits.eap import eap, example_scores
    from attrgraph.circuits.edge_pruning import PruneConfig, prune_edges
    from attrgraph.circuits.evaluate import evaluate
    from attrgraph.circuits.peap import peap

    scores = eap(model, pairs)
    ex = example_scores(model, pairs, cross_position=True)
    positional = peap(model, pairs, example=ex)
    circuit = top_n(scores, 20)
    faith = evaluate(model, pairs, circuit)
    pruned = prune_edges(model, pairs, PruneConfig(steps=3, sparsity=0.9, batch_size=4))
    return {
        "eap": scores.resid.numpy(),
        "peap": positional.attn.numpy(),
        "faith": np.array([faith.soft, faith.kl]),
        "ep": pruned.log_alpha.numpy(),
    }


@pytest.mark.parametrize("arch", ["gpt2", "llama"])  # multi-head; grouped-query attention, run ungrouped
def test_circuits_on_device(device, foreign_default_device, arch):
    from tests.attrgraph import ag_helpers
    from tests.attrgraph.circuits import circuit_helpers

    def tiny_model():
        if arch == "gpt2":
            return circuit_helpers.tiny_model(torch.float32)
        return ag_helpers.tiny_model(arch, torch.float32, d_vocab=circuit_helpers.V)

    pairs = circuit_helpers.make_pairs()
    ref = _circuits(tiny_model(), pairs)
    model = tiny_model().to(device)
    with foreign_default_device():
        got = _circuits(model, pairs)
    for k, v in ref.items():
        if k == "ep" and device.type != "cpu":
            continue  # the gates are sampled from the device's generator
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=k)


CODER_OUTPUTS = ("TranscoderOutput", "TopKOutput")  # a set's forward; the sparse TopK step's


@pytest.mark.parametrize(
    "kind, activation",
    [("plt", "jumprelu"), ("plt", "topk"), ("clt", "jumprelu"), ("clt", "batchtopk"), ("sae", "topk")],
)  # PLT TopK: the sparse step; SAE: on the attention output
def test_a_training_step_runs_on_the_models_device(device, tmp_path, kind, activation):
    from tests.transcoders.tc_helpers import tiny_model
    from transcoders.train import TrainConfig, train

    model = tiny_model().to(device)
    seqs = torch.randint(0, 50, (256, 32), generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(
        kind=kind,
        activation=activation,
        k=4,
        hook="blocks.{layer}.hook_attn_out" if kind == "sae" else "",
        d_sae=32,
        n_tokens=256 * 4,
        batch_size=256,
        block_tokens=1024,
        out=str(tmp_path / "run"),
    )
    seen = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: seen.append(o.out.device) if type(o).__name__ in CODER_OUTPUTS else None
    )
    try:
        tc, info = train(cfg, model=model, sequences=seqs, progress=False)
    finally:
        hook.remove()
    assert info["steps"] == 4 and seen and all(d.type == device.type for d in seen)
    assert tc.device.type == device.type


def test_a_models_blocks_stay_on_its_device_and_equal_the_cpus(device):
    """activation_store step 3b: a GPU model's block stays on the GPU (a step then copies nothing from
    the host), and holds the CPU model's activations in the same shuffled order."""
    from tests.transcoders.tc_helpers import tiny_model
    from transcoders.activation_store import ActivationStore
    from transcoders.train import TrainConfig, transcoder_config

    seqs = torch.randint(0, 50, (256, 32), generator=torch.Generator().manual_seed(0))
    blocks = []
    for dev in ("cpu", device):
        model = tiny_model().to(dev)
        store = ActivationStore(
            model, transcoder_config(TrainConfig(), model), seqs, batch_size=64, block_tokens=1024
        )
        blocks.append(store.block(1))
    (x_ref, y_ref), (x, y) = blocks
    assert x.device.type == y.device.type == torch.device(device).type
    torch.testing.assert_close(x.cpu(), x_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.cpu(), y_ref, rtol=1e-5, atol=1e-5)


def test_transcoders_on_another_device_than_the_model_are_refused():
    from attrgraph.engine.attribute import attribute
    from transcoders import TranscoderMismatchError

    model, tc = _model("cpu")
    with pytest.raises(
        TranscoderMismatchError, match=r"transcoders are on meta but the model is on cpu.*\.to\("
    ):
        attribute(model, tc.to("meta"), PROMPT)
