"""Tiny random models and transcoder sets for the transcoders tests (seeded, CPU)."""

import torch


def tiny_model(seed: int = 0, **overrides):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    kw = dict(
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_head=8,
        d_mlp=64,
        d_vocab=50,
        n_ctx=32,
        act_fn="gelu",
        normalization_type="LN",
        seed=seed,
    )
    kw.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(**kw))
    # TL initializes norm weights to 1 and biases to 0; make them non-trivial so a
    # convention that drops ln2's weight or bias cannot pass by accident. The noise is drawn on the
    # host (the same values on every device) and moved beside the parameter (a cuda model).
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.split(".")[-1]
            if leaf.startswith("b"):
                p.add_(0.1 * torch.randn(p.shape, generator=g).to(p.device))
            elif leaf == "w":
                p.mul_(1.0 + 0.3 * torch.randn(p.shape, generator=g).to(p.device))
    return model.eval()


def random_set(kind="plt", activation="jumprelu", skip=False, n_layers=2, d_model=32, d_sae=48, seed=0, **kw):
    from transcoders import TranscoderConfig, build_transcoders

    if kind == "sae":
        kw.setdefault("input_hook", "blocks.{layer}.hook_attn_out")
        kw.setdefault("output_hook", "blocks.{layer}.hook_attn_out")
    cfg = TranscoderConfig(
        kind=kind,
        n_layers=n_layers,
        d_model=d_model,
        d_sae=d_sae,
        activation=activation,
        skip=skip,
        k=min(8, d_sae),
        **kw,
    )
    g = torch.Generator().manual_seed(seed)
    tc = build_transcoders(cfg).init_weights(g)
    with torch.no_grad():  # non-trivial biases, thresholds and skip, so round trips test every tensor
        for p in tc.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.device))
        if tc.threshold is not None:
            tc.threshold.abs_()
    return tc


# a tiny feature-sharded training run of the bundled model (test_distributed*.py)
CLI_ARGS = [
    "--kind",
    "plt",
    "--d-sae",
    "32",
    "--n-tokens",
    "1024",
    "--batch-size",
    "256",
    "--block-tokens",
    "1024",
]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(worker, root, timeout: float = 300) -> None:
    """`worker(rank, root, port)` in two spawned processes, as torchrun's ranks (the worker sets their
    environment); both must end on their own within `timeout` seconds each. Either left is killed."""
    import os
    import signal

    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        worker, args=(str(root), str(free_port())), nprocs=2, join=False, start_method="spawn"
    )
    try:
        for p in ctx.processes:
            p.join(timeout)
            assert p.exitcode == 0, "a rank did not end on its own"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(10)
