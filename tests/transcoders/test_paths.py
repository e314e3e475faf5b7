"""Where the bundled artefacts are found: an installed copy first, else the checkout's data/."""

from pathlib import Path

from transcoders.paths import BUNDLED, DATA_DIR, data_dir

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path, *folders: str) -> Path:
    for folder in folders:
        (root / folder / "default-plt").mkdir(parents=True)
    return root


def test_an_installed_copy_wins_over_a_data_folder_beside_it(tmp_path):
    """site-packages may hold an unrelated top-level data/ (some wheels install one): never read it."""
    root = _tree(tmp_path, "attrgraph/_data", "data")
    assert data_dir(root) == root / "attrgraph" / "_data"


def test_a_checkout_reads_data_in_place(tmp_path):
    root = _tree(tmp_path, "data")
    assert data_dir(root) == root / "data"


def test_this_checkout_resolves_to_its_data_folder():
    import attrgraph.bundled.paths

    assert DATA_DIR == REPO / "data"
    assert attrgraph.bundled.paths.DATA_DIR == DATA_DIR
    assert attrgraph.bundled.paths.BUNDLED == {"default": REPO / "data" / "default", **BUNDLED}
    missing = [
        name
        for name, folder in attrgraph.bundled.paths.BUNDLED.items()
        if not (folder / "manifest.json").is_file()
    ]
    assert not missing, f"bundled data missing from {DATA_DIR}: {missing}; restore data/ from git"
