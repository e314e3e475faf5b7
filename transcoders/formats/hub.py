"""Sets named as their libraries name them on the Hugging Face hub, resolved to files on this machine.

A name that is neither a bundled set nor a path that exists is read as a hub reference when it has
one of the forms circuit-tracer's `load_transcoder_from_hub` takes:
1. `owner/repo`, or `owner/repo/sub/folder` (the set in a folder of the repository), each with an
   optional `@revision` (a branch, tag or commit);
2. `hf://owner/repo/sub/folder?revision=R`;
3. circuit-tracer's two legacy names, "gemma" (`mwhanna/gemma-scope-transcoders`) and "llama"
   (`mntss/transcoder-Llama-3.2-1B`).
A set circuit-tracer has moved into its own cache (`save_transcoders_to_cache`, which converts it
to its `layer_{i}.safetensors` files and by default deletes the hub's copies) is read from there
first, as circuit-tracer's `load_transcoder_from_hub` reads it: `CIRCUIT_TRACER_CACHE_DIR`, else
`~/.cache/circuit_tracer`, then the reference (`owner/repo[/folder][@revision]`), complete once its
`config.yaml` is there (circuit-tracer writes it last). Otherwise
it resolves through huggingface_hub's own `snapshot_download` / `hf_hub_download`: from the local
cache (`HF_HUB_CACHE`, `HF_HOME`) when the files are there, downloading only where the network is
reachable and `HF_HUB_OFFLINE` is unset (the command line sets it unless told otherwise). The folder
it gives is then read like any other (its format detected), so the sets circuit-tracer, EleutherAI
sparsify and our own writers publish load by the names their users know. A file a circuit-tracer
`config.yaml` lists as `hf://...` (e.g. GemmaScope's `params.npz` under `mwhanna/gemma-scope-transcoders`)
is fetched the same way, one at a time (`fetch_file`).

Every failure (not cached while offline, no such repository or revision, a gated one without a
token) is one `TranscoderNotFoundError` sentence that names the reference and what to do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, urlparse

from transcoders.errors import TranscoderNotFoundError

LEGACY = {"gemma": "mwhanna/gemma-scope-transcoders", "llama": "mntss/transcoder-Llama-3.2-1B"}
"""circuit-tracer's short names of its first two published sets."""

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""One component of a repository id or of a path inside one (no `..`, no leading `.` or `-`)."""


FETCHED = ("*.json", "*.yaml", "*.safetensors")
"""What a download of a set takes from its repository (or folder): the configs and weights of every
format read from a folder. Not GemmaScope's npz: its repositories hold every width and L0 of every
layer (hundreds of GB), so its files are named one per layer (a list of `hf://` files, or
circuit-tracer's "gemma" config, which lists them)."""


class HubRef(NamedTuple):
    """A set on the hub: its repository, the folder (or file) inside it, and the revision."""

    repo_id: str
    path: str | None
    revision: str | None

    def __str__(self) -> str:
        inside = f"/{self.path}" if self.path else ""
        return f"{self.repo_id}{inside}" + (f"@{self.revision}" if self.revision else "")


def parse_hub_ref(name: str) -> HubRef | None:
    """The `HubRef` a name stands for (forms 1-3 of the module docstring), or None when it is not one
    (a local-looking path: absolute, starting with `.` or `~`, or holding a part no repository may)."""
    name = LEGACY.get(name, name)
    if name.startswith("hf://"):
        url = urlparse(name)
        parts = [url.netloc, *url.path.strip("/").split("/")] if url.path.strip("/") else [url.netloc]
        revision = parse_qs(url.query).get("revision", [None])[0] or None
    else:
        body, _, revision = name.partition("@")
        parts = body.strip("/").split("/") if body and not body.startswith(("/", "~")) else []
        revision = revision or None
    if len(parts) < 2 or not all(_PART.fullmatch(p) and ".." not in p for p in parts):
        return None
    return HubRef("/".join(parts[:2]), "/".join(parts[2:]) or None, revision)


def _why(ref: HubRef, e: Exception) -> str:
    """Why huggingface_hub could not give `ref` (its error `e`), and what to do, as a clause."""
    from huggingface_hub import constants, errors

    offline = constants.is_offline_mode()
    if isinstance(e, errors.GatedRepoError):
        why = "is gated: accept its terms on huggingface.co and log in (`hf auth login`)"
    elif isinstance(e, errors.RevisionNotFoundError):
        why = "names a revision the repository does not have"
    elif isinstance(e, errors.RepositoryNotFoundError):
        why = "is no repository on the hub (or a private one: log in with `hf auth login`)"
    elif isinstance(e, errors.EntryNotFoundError) and not isinstance(e, errors.LocalEntryNotFoundError):
        why = "is no file of that repository"
    elif offline:
        why = (
            f"is not in the Hugging Face cache and HF_HUB_OFFLINE is set: download it once (`hf download "
            f"{ref.repo_id}`) or unset HF_HUB_OFFLINE"
        )
    else:
        why = f"could not be fetched ({type(e).__name__}); check the network, or download it once with `hf download`"
    return why


def circuit_tracer_cache() -> Path:
    """circuit-tracer's cache of converted sets (its `get_cache_dir`)."""
    env = os.environ.get("CIRCUIT_TRACER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "circuit_tracer"


def fetch_folder(ref: HubRef) -> Path:
    """The local folder of `ref`: circuit-tracer's converted copy when its cache holds one, else a
    snapshot of the repository (or of its folder `ref.path` alone)."""
    from huggingface_hub import snapshot_download

    converted = circuit_tracer_cache() / str(ref)
    if (converted / "config.yaml").is_file():
        return converted

    prefix = f"{ref.path}/" if ref.path else ""
    patterns = [prefix + p for p in FETCHED]
    try:
        root = Path(snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=patterns))
    except Exception as e:  # huggingface_hub's errors, and the network's, told apart in _why
        raise TranscoderNotFoundError(
            f"no transcoders at {ref}: no such folder here, and the hub reference {ref} {_why(ref, e)}."
        ) from e
    folder = root / ref.path if ref.path else root
    if not folder.is_dir():
        raise TranscoderNotFoundError(
            f"no transcoders at {ref}: the repository {ref.repo_id} has no folder {ref.path!r}."
        )
    return folder


def file_ref(uri: str, listed_in: Path | str) -> HubRef:
    """The `HubRef` of the file an `hf://owner/repo/path/file?revision=R` URI names, or one line
    (`listed_in`: what lists it, for the error)."""
    ref = parse_hub_ref(uri)
    if ref is None or ref.path is None:
        raise TranscoderNotFoundError(
            f"{listed_in} lists {uri!r}, which is no hub file reference; name files as hf://owner/repo/path/file."
        )
    return ref


def fetch_file(uri: str, listed_in: Path | str) -> Path:
    """The local copy of the file `uri` names (`file_ref`)."""
    from huggingface_hub import hf_hub_download

    ref = file_ref(uri, listed_in)
    try:
        return Path(hf_hub_download(ref.repo_id, ref.path, revision=ref.revision))
    except Exception as e:  # as in fetch_folder
        raise TranscoderNotFoundError(f"{listed_in} lists {uri}, which {_why(ref, e)}.") from e
