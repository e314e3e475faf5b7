"""benchmarks/frontier.py's `import_sae_lens_training`: on a machine without sae_lens's runner packages
(the GPU machine has no wandb), sae_lens's JumpReLU training SAE still imports, and computes what it
computes under sae_lens's own full import (the oracle: a fresh process with the package as installed)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~13 s: two processes import sae_lens

ROOT = Path(__file__).resolve().parents[1]

STEP = """
import json, sys
{block}
sys.path.insert(0, "benchmarks")
import torch
from frontier import SAE_LENS_SETUP, import_sae_lens_training
import_sae_lens_training()
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
from sae_lens.saes.sae import TrainStepInput

torch.manual_seed(0)
cfg = JumpReLUTrainingSAEConfig(d_in=16, d_sae=64, apply_b_dec_to_input=False,
    normalize_activations="none", l0_coefficient=0.05, l0_warm_up_steps=1, **SAE_LENS_SETUP)
sae = JumpReLUTrainingSAE(cfg)
x = torch.randn(32, 16)
acts, pre = sae.encode_with_hidden_pre(x)
out = sae.decode(acts)
aux = sae.calculate_aux_loss(TrainStepInput(sae_in=x, coefficients={{"l0": 0.05}},
    dead_neuron_mask=torch.zeros(64, dtype=torch.bool), n_training_steps=0, is_logging_step=False), acts, pre, out)
loss = (out - x).pow(2).sum(-1).mean() + sum(aux.values())
loss.backward()
print(json.dumps(dict(loss=loss.item(), grad=sae.W_enc.grad.abs().sum().item(),
    wandb="wandb" in sys.modules and sys.modules["wandb"] is not None)))
"""


def run(block: str) -> tuple[dict, str]:
    res = subprocess.run(
        [sys.executable, "-c", STEP.format(block=block)], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stdout


def test_the_training_sae_without_wandb_computes_what_the_full_import_computes():
    full, _ = run("")
    lean, said = run("sys.modules['wandb'] = None  # as on the GPU machine: `import wandb` fails")
    assert "importing its SAE modules alone (wandb is missing)" in said
    assert full["wandb"] and not lean["wandb"]
    assert lean["loss"] == full["loss"] and lean["grad"] == full["grad"]
