"""Manifests of bundled artefacts: sha256 sums of a folder's files, written at training time and
checked at load time. Models (`attrgraph.load_model`) and transcoder sets use the same check."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_manifest(folder: Path, missing: type[Exception], mismatch: type[Exception]) -> dict:
    """Check every sha256 under "files" of `folder/manifest.json`; return the manifest ({} if none).

    A listed file that is absent raises `missing`, one whose sum differs raises `mismatch`
    (each caller passes its own exception classes)."""
    path = folder / "manifest.json"
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = dict(manifest.get("files", {}))
    except (ValueError, AttributeError, TypeError) as e:  # not JSON, not UTF-8, not an object
        raise mismatch(f"{path} is not a JSON manifest ({e}); restore it from git.") from None
    for rel, digest in files.items():
        file = folder / rel
        if not file.exists():
            raise missing(f"{file} is listed in {path} but missing; restore it from git.")
        if sha256(file) != digest:
            raise mismatch(
                f"{file} does not match the sha256 in {path}; restore it from git or re-run the manifest's command."
            )
    return manifest
