"""The sdist and wheel carry the bundled data/ and every module, and the wheel's copy is what
`transcoders.paths.data_dir` finds once installed. (.ci/run also installs the wheel into a fresh
venv and runs it; this is the fast half, without an install.)"""

import hashlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from transcoders.paths import data_dir

REPO = Path(__file__).resolve().parents[1]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(folder: Path, suffix: str = "") -> list[str]:
    """The files under `folder`, less hidden ones (the writer locks edit_h5 leaves beside a
    regenerated data/*/dashboards.h5 are neither tracked nor shipped)."""
    return sorted(
        p.relative_to(REPO).as_posix()
        for p in folder.rglob(f"*{suffix}")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")
    )


def test_sdist_and_wheel_carry_data_and_modules(tmp_path):
    # the sdist from the tree, the wheel from the sdist (so no build/ is left in the tree); without
    # build isolation: offline, seconds
    run = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "-o", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    (sdist,) = tmp_path.glob("*.tar.gz")
    data = _files(REPO / "data")
    assert {"data/default/model.safetensors", "data/default-plt/weights.safetensors"} <= set(data)

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        modules = _files(REPO / "attrgraph", ".py") + _files(REPO / "transcoders", ".py")
        assert not [m for m in modules if m not in names], "modules missing from the wheel"
        static = _files(REPO / "attrgraph" / "viewer" / "static")
        assert "attrgraph/viewer/static/viewer.js" in static
        assert not [f for f in static if f not in names], "the viewer's page is missing from the wheel"
        for name in data:  # data/x -> attrgraph/_data/x, byte for byte
            packed = "attrgraph/_data/" + name.removeprefix("data/")
            assert packed in names, f"{packed} missing from the wheel"
            assert _sha(zf.read(packed)) == _sha((REPO / name).read_bytes()), packed
        zf.extractall(tmp_path / "site-packages")
    found = data_dir(tmp_path / "site-packages")
    assert found == tmp_path / "site-packages" / "attrgraph" / "_data"
    assert sorted(p.name for p in found.iterdir()) == [
        "default",
        "default-attn-sae",
        "default-clt",
        "default-plt",
    ]

    with tarfile.open(sdist) as tf:  # a wheel built from the sdist needs data/ in it
        top = tf.getnames()[0].split("/")[0]
        in_sdist = {n.removeprefix(top + "/") for n in tf.getnames()}
    assert not [n for n in data + ["pyproject.toml"] if n not in in_sdist]
