"""Sets loaded by their hub names (transcoders/formats/hub.py) and circuit-tracer's `transcoders:`
lists (circuit_tracer.py step 4), from a Hugging Face cache laid out as huggingface_hub keeps it
(`models--owner--repo/refs/<revision>`, `snapshots/<commit>/...`), offline.

The oracles are the libraries that publish the sets, reading the same cache by the same names:
circuit-tracer's `load_transcoder_from_hub` (and, for the GemmaScope list, its own `download_hf_uri`
and `load_transcoder_set`, since its `load_transcoders` asks the hub about the repository first and
cannot run offline), in the peer venv; EleutherAI sparsify's `SparseCoder.load_many`, in ours."""

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.attrgraph.peer_frontend import run_peer
from tests.transcoders.tc_helpers import random_set
from transcoders import TranscoderNotFoundError, load_transcoders, save_transcoders
from transcoders.errors import CorruptTranscoderError, UnknownFormatError
from transcoders.formats.hub import parse_hub_ref

N_POS = 7


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, used by huggingface_hub here and in the peer's process, offline."""
    import huggingface_hub.constants as hf

    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CIRCUIT_TRACER_CACHE_DIR", str(tmp_path / "ct-cache"))  # circuit-tracer's own
    return folder


def put(cache: Path, repo_id: str, files: dict[str, Path], revisions=("main",)) -> None:
    """Files into the cache as huggingface_hub lays out a downloaded snapshot of `repo_id`."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revisions}".encode()).hexdigest()  # a snapshot per call
    for name, src in files.items():
        dst = repo / "snapshots" / commit / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for r in revisions:
        (repo / "refs" / r).write_text(commit)


def folder_files(folder: Path, under: str = "") -> dict[str, Path]:
    return {f"{under}{p.relative_to(folder)}": p for p in folder.rglob("*") if p.is_file()}


# circuit-tracer reading a set from the cache: its activations and reconstructions of x
# [n_layers, n_pos, d_model] (npz at argv[3]), and its hooks.
CT_READ = r"""
import json, sys
import numpy as np, torch, yaml
ref, mode, x_path, out = sys.argv[1:]
x = torch.from_numpy(np.load(x_path))
if mode in ("hub", "cached"):  # the hub's files, or circuit-tracer's own cache first
    from circuit_tracer.utils.hf_utils import load_transcoder_from_hub
    tc, _ = load_transcoder_from_hub(
        ref, dtype=torch.float32, lazy_encoder=False, lazy_decoder=False, use_cache=mode == "cached"
    )
else:  # a config.yaml listing hf:// files, read by circuit-tracer's own pieces
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
    from circuit_tracer.utils.hf_utils import download_hf_uri
    cfg = yaml.safe_load(open(ref))
    paths = {i: download_hf_uri(p) if p.startswith("hf://") else p for i, p in enumerate(cfg["transcoders"])}
    tc = load_transcoder_set(paths, scan="test", feature_input_hook=cfg["feature_input_hook"],
        feature_output_hook=cfg["feature_output_hook"], special_load_fn=mode, lazy_encoder=False, lazy_decoder=False)
with torch.no_grad():
    if hasattr(tc, "transcoders"):
        acts = torch.stack([t.encode(x[l]) for l, t in enumerate(tc.transcoders)])
        recon = torch.stack([t.decode(acts[l], x[l]) for l, t in enumerate(tc.transcoders)])
    else:
        acts = tc.encode(x)
        recon = tc.forward(x)
np.savez(out, acts=acts.numpy(), recon=recon.numpy())
print(json.dumps({"input": tc.feature_input_hook, "output": tc.feature_output_hook}))
"""


def x_for(tc, tmp_path) -> tuple[torch.Tensor, Path]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(tc.n_layers, N_POS, tc.d_model, generator=g)
    path = tmp_path / "x.npy"
    np.save(path, x.numpy())
    return x, path


def assert_computes_as_ct(tc, ref, mode, tmp_path):
    """Our set `tc` equals circuit-tracer's reading of `ref`: activations and reconstructions."""
    x, x_path = x_for(tc, tmp_path)
    hooks = run_peer(CT_READ, ref, mode, x_path, tmp_path / "ct.npz")
    ct = np.load(tmp_path / "ct.npz")
    with torch.no_grad():
        ours = tc(x.transpose(0, 1))  # ours: [..., n_layers, d_model]
    acts, out = ours.acts.transpose(0, 1), ours.out.transpose(0, 1)
    assert (acts > 0).any() and (acts == 0).any()  # some features on, some off: the rule is checked
    torch.testing.assert_close(acts, torch.from_numpy(ct["acts"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, torch.from_numpy(ct["recon"]), rtol=1e-5, atol=1e-6)
    return hooks


def test_a_circuit_tracer_plt_repo_loads_by_its_name(cache, tmp_path):
    tc = random_set("plt", "jumprelu", skip=True, n_layers=3, seed=1)
    save_transcoders(tc, tmp_path / "plt", format="circuit-tracer")
    put(cache, "someone/plt-set", folder_files(tmp_path / "plt"))
    ours = load_transcoders("someone/plt-set")
    assert (ours.cfg.kind, ours.cfg.n_layers, ours.cfg.skip) == ("plt", 3, True)
    assert_computes_as_ct(ours, "someone/plt-set", "hub", tmp_path)


def test_a_circuit_tracer_clt_in_a_folder_of_a_tagged_revision(cache, tmp_path):
    tc = random_set("clt", "jumprelu", n_layers=3, seed=2)
    save_transcoders(tc, tmp_path / "clt", format="circuit-tracer")
    other = random_set("plt", "relu", n_layers=2, seed=3)  # beside it in the repo, not read
    save_transcoders(other, tmp_path / "plt", format="circuit-tracer")
    put(
        cache,
        "someone/clts",
        folder_files(tmp_path / "clt", "wide/") | folder_files(tmp_path / "plt", "small/"),
        revisions=("v1",),
    )
    newer = random_set("clt", "jumprelu", n_layers=3, seed=8)  # on main, a later commit: not read
    save_transcoders(newer, tmp_path / "newer", format="circuit-tracer")
    put(cache, "someone/clts", folder_files(tmp_path / "newer", "wide/"), revisions=("main",))
    for ref in ("someone/clts/wide@v1", "hf://someone/clts/wide?revision=v1"):
        ours = load_transcoders(ref)
        assert (ours.cfg.kind, ours.cfg.n_layers) == ("clt", 3)
    assert_computes_as_ct(ours, "someone/clts/wide@v1", "hub", tmp_path)


GEMMASCOPE = "google/gemma-scope-2b-pt-transcoders"


def gemma_in_cache(cache: Path, tmp_path: Path) -> dict:
    """circuit-tracer's "gemma" in the cache: `mwhanna/gemma-scope-transcoders` holds only a
    config.yaml listing `hf://google/gemma-scope-2b-pt-transcoders/layer_{i}/width_16k/average_l0_{n}/params.npz`,
    which `google/gemma-scope-2b-pt-transcoders` holds (3 layers of a random JumpReLU set). The config."""
    tc = random_set("plt", "jumprelu", n_layers=3, seed=4)
    save_transcoders(tc, tmp_path / "gs", format="gemmascope")
    repo = GEMMASCOPE
    names = {
        f"layer_{l}/width_16k/average_l0_{(91, 15, 40)[l]}/params.npz": tmp_path / f"gs/layer_{l}/params.npz"
        for l in range(3)
    }
    put(cache, repo, names)
    config = {
        "model_name": "google/gemma-2-2b",
        "model_kind": "transcoder_set",
        "feature_input_hook": "ln2.hook_normalized",
        "feature_output_hook": "hook_mlp_out",
        "transcoders": [f"hf://{repo}/{name}" for name in names],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    put(cache, "mwhanna/gemma-scope-transcoders", {"config.yaml": tmp_path / "config.yaml"})
    return config


def test_gemma_loads_the_gemmascope_files_its_config_lists(cache, tmp_path):
    config = gemma_in_cache(cache, tmp_path)
    repo = GEMMASCOPE
    ours = load_transcoders("gemma")
    assert (ours.cfg.kind, ours.cfg.n_layers, ours.cfg.model_name) == ("plt", 3, "google/gemma-2-2b")
    assert (ours.cfg.input_hook, ours.cfg.output_hook) == (
        "blocks.{layer}.ln2.hook_normalized",
        "blocks.{layer}.hook_mlp_out",
    )
    hooks = assert_computes_as_ct(ours, str(tmp_path / "config.yaml"), "gemma-scope", tmp_path)
    assert hooks == {"input": "ln2.hook_normalized", "output": "hook_mlp_out"}
    # the same files named in a list, in Python (no format needed: they are npz), and refused by the
    # repository's name, which would fetch every width and L0 of every layer
    listed = load_transcoders(config["transcoders"])
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(listed.state_dict()[name], value, rtol=0, atol=0)
    with pytest.raises(UnknownFormatError) as e:
        load_transcoders(repo)
    assert "pass a list of one hf://google/gemma-scope-2b-pt-transcoders/layer_{i}/" in one_line(e)


CT_SAVE_TO_CACHE = r"""
import json, sys
from circuit_tracer.utils.caching import save_transcoders_to_cache
print(json.dumps({"path": str(save_transcoders_to_cache(sys.argv[1]))}))
"""


def test_a_set_circuit_tracer_moved_into_its_own_cache_loads_from_there(cache, tmp_path):
    """circuit-tracer's `save_transcoders_to_cache("gemma")` converts the set into its cache and
    deletes the hub cache's npz files: "gemma" still loads, from circuit-tracer's copy, as
    circuit-tracer's own `load_transcoder_from_hub` (which looks there first) reads it."""
    gemma_in_cache(cache, tmp_path)
    saved = Path(run_peer(CT_SAVE_TO_CACHE, "gemma")["path"])
    assert saved == tmp_path / "ct-cache" / "mwhanna/gemma-scope-transcoders"
    assert not list((cache / f"models--{GEMMASCOPE.replace('/', '--')}").rglob("*.npz"))  # deleted by it
    ours = load_transcoders("gemma")
    assert ours.cfg.n_layers == 3
    assert_computes_as_ct(ours, "gemma", "cached", tmp_path)


def test_a_list_of_npz_files_is_read_as_gemmascope(tmp_path):
    tc = random_set("plt", "jumprelu", n_layers=2, seed=9)
    save_transcoders(tc, tmp_path, format="gemmascope")
    ours = load_transcoders([tmp_path / f"layer_{l}/params.npz" for l in range(2)])
    assert ours.cfg.kind == "plt"
    for name, value in tc.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], value, rtol=0, atol=0)


def test_a_local_config_listing_its_layer_files(tmp_path):
    """Paths in the list are the folder's (circuit-tracer takes them from where it runs; given here
    absolute to it, so both read the same files)."""
    tc = random_set("plt", "relu", skip=True, n_layers=2, seed=6)
    save_transcoders(tc, tmp_path / "files", format="circuit-tracer")
    folder = tmp_path / "set"
    folder.mkdir()
    meta = yaml.safe_load((tmp_path / "files/config.yaml").read_text())
    meta["transcoders"] = [f"../files/layer_{l}.safetensors" for l in range(2)]
    (folder / "config.yaml").write_text(yaml.safe_dump(meta))
    ours = load_transcoders(folder)
    meta["transcoders"] = [str(tmp_path / f"files/layer_{l}.safetensors") for l in range(2)]
    (tmp_path / "abs.yaml").write_text(yaml.safe_dump(meta))
    assert_computes_as_ct(ours, str(tmp_path / "abs.yaml"), "none", tmp_path)


def test_a_sparsify_repo_loads_by_its_name(cache, tmp_path):
    sparsify = pytest.importorskip("sparsify")
    g = torch.Generator().manual_seed(7)
    for l in range(2):
        sc = sparsify.SparseCoder(
            16, sparsify.SparseCoderConfig(num_latents=40, k=4, skip_connection=True, transcode=True)
        )
        with torch.no_grad():
            for p in sc.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        sc.save_to_disk(tmp_path / "sp" / f"layers.{l}.mlp")
    put(cache, "EleutherAI/skip-transcoder-tiny", folder_files(tmp_path / "sp"))
    theirs = sparsify.SparseCoder.load_many("EleutherAI/skip-transcoder-tiny")
    ours = load_transcoders("EleutherAI/skip-transcoder-tiny")
    x = torch.randn(N_POS, 2, 16, generator=g)
    with torch.no_grad():
        out = ours(x).out
        for l, name in enumerate(sorted(theirs)):
            torch.testing.assert_close(out[:, l], theirs[name](x[:, l]).sae_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("owner/repo", ("owner/repo", None, None)),
        ("owner/repo/a/b@v2", ("owner/repo", "a/b", "v2")),
        ("hf://owner/repo/a?revision=main", ("owner/repo", "a", "main")),
        ("llama", ("mntss/transcoder-Llama-3.2-1B", None, None)),
        ("nosuch", None),
        ("/abs/path", None),
        ("./rel/path", None),
        ("~/x/y", None),
        ("a/../b", None),
        ("runs/plt set", None),
    ],
)
def test_which_names_are_hub_references(name, ref):
    """Forms as circuit-tracer's `HfUri.from_str` / `parse_hf_uri` split them; local-looking paths none."""
    got = parse_hub_ref(name)
    assert (tuple(got) if got else None) == ref


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


def test_what_is_not_in_the_cache_says_so_in_one_line(cache, tmp_path):
    with pytest.raises(TranscoderNotFoundError) as e:
        load_transcoders("someone/absent")
    msg = one_line(e)
    assert "no transcoders at someone/absent" in msg and "hf download someone/absent" in msg
    assert "HF_HUB_OFFLINE" in msg
    tc = random_set("plt", "relu", n_layers=2)
    save_transcoders(tc, tmp_path / "plt", format="circuit-tracer")
    put(cache, "someone/plt", folder_files(tmp_path / "plt"))
    with pytest.raises(TranscoderNotFoundError) as e:
        load_transcoders("someone/plt/nofolder")
    assert "has no folder 'nofolder'" in one_line(e)
    with pytest.raises(TranscoderNotFoundError) as e:
        load_transcoders("someone/plt@v9")  # a revision the cache has no ref of
    assert "someone/plt@v9" in one_line(e)
    with pytest.raises(TranscoderNotFoundError) as e:
        load_transcoders("./no/such/folder")
    assert "no transcoders at no/such/folder" in one_line(e)


def listing(tmp_path, listed, kind="transcoder_set") -> Path:
    folder = tmp_path / "listing"
    folder.mkdir(exist_ok=True)
    meta = {"model_kind": kind, "feature_input_hook": "hook_resid_mid", "feature_output_hook": "hook_mlp_out"}
    (folder / "config.yaml").write_text(yaml.safe_dump(meta | {"transcoders": listed}))
    return folder


def test_bad_lists_are_refused_in_one_line(cache, tmp_path):
    tc = random_set("plt", "jumprelu", n_layers=2)
    save_transcoders(tc, tmp_path / "gs", format="gemmascope")
    save_transcoders(tc, tmp_path / "ct", format="circuit-tracer")
    cases = [
        (["hf://google/absent/layer_0/params.npz"], TranscoderNotFoundError, "lists hf://google/absent"),
        (["hf://google"], TranscoderNotFoundError, "no hub file reference"),
        (["layer_0.npz"], TranscoderNotFoundError, "lists 'layer_0.npz', which is no file"),
        ("layer_0.npz", CorruptTranscoderError, "one file (a path or hf:// URI) per layer"),
        ([], CorruptTranscoderError, "one file (a path or hf:// URI) per layer"),
        ([1, 2], CorruptTranscoderError, "one file (a path or hf:// URI) per layer"),
        (
            [str(tmp_path / "gs/layer_0/params.npz"), str(tmp_path / "ct/layer_1.safetensors")],
            CorruptTranscoderError,
            "a set is one kind",
        ),
        ([str(tmp_path / "ct/config.yaml")], CorruptTranscoderError, "a set is one kind"),
    ]
    for listed, error, words in cases:
        with pytest.raises(error) as e:
            load_transcoders(listing(tmp_path, listed))
        assert words in one_line(e), (listed, str(e.value))
    with pytest.raises(UnknownFormatError) as e:
        load_transcoders(
            listing(tmp_path, [str(tmp_path / "ct/layer_0.safetensors")], "cross_layer_transcoder")
        )
    assert "GemmaScope 2" in one_line(e)


def test_the_command_line_names_what_is_missing(cache, tmp_path):
    """`attrgraph build --transcoders owner/repo` for a repository not cached: exit 2, one line, before
    the model loads."""
    cmd = [
        sys.executable,
        "-m",
        "attrgraph.cli",
        "build",
        "hello",
        "--transcoders",
        "someone/absent",
        "-o",
        str(tmp_path / "g.h5"),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "hf download someone/absent" in lines[0], res.stderr
    assert not (tmp_path / "g.h5").exists()
