"""A Hugging Face model id (`org/name[@revision]`) -> the files the importer reads, no weights.

Read through `huggingface_hub` (the optional extra `hf`: `pip install 'recipegen[hf]'`), so its
own conventions hold: `HF_TOKEN` (gated and private models), `HF_ENDPOINT`, `HF_HUB_OFFLINE=1`
(the hub cache only) and the hub cache (`HF_HOME`, `HF_HUB_CACHE`), where the files land as
they would for `vllm serve`:

- `config.json` (required), `hf_quant_config.json` and `model.safetensors.index.json` (where the
  checkpoint has them) by `hf_hub_download`, pinned to the commit `config.json` resolved to;
- each shard's header by two HTTP range requests (`HfApi.parse_safetensors_file_metadata`: the
  first 100,000 bytes, then the rest of the header if longer) — or from the cache where the
  shard itself is there. No tensor data is read.

The importer reads a checkpoint folder, so the files are staged in a temporary folder: the three
JSON files, and each shard as its header followed by a hole up to the shard's size (a sparse
file: a shard's layout with none of its bytes).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from recipegen.common.errors import InputError
from recipegen.common.units import format_count
from recipegen.schema.patterns import is_hf_repo_id

# a branch, tag or commit after `@`; the repo id before it is `is_hf_repo_id`'s (schema.patterns)
HUB_REVISION = re.compile(r"[A-Za-z0-9._/-]+")
CONFIG, QUANT, INDEX = "config.json", "hf_quant_config.json", "model.safetensors.index.json"
# A safetensors header larger than this is not plausible (DeepSeek-V3's largest shard: ~300 KB).
MAX_HEADER = 100 * 2**20


@dataclass
class HubCheckpoint:
    """The staged folder and what was (not) read."""

    repo_id: str
    revision: str | None       # as asked
    commit: str                # the commit the files came from
    folder: Path               # staged: config.json (+ hf_quant_config.json, index, shard headers)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.repo_id}@{self.commit}"


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """`org/name[@revision]` -> (repo id, revision), or None when `text` is not one.

    The repo id is a `model.checkpoint` id (`is_hf_repo_id`: the Hub's rule, with the namespace
    required), so the model a hub read builds carries a checkpoint its schema accepts."""
    repo, at, revision = text.partition("@")
    if not is_hf_repo_id(repo):
        return None
    if not at:
        return repo, None
    if HUB_REVISION.fullmatch(revision) is None or "//" in revision:
        return None
    return repo, revision


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise InputError("reading a Hugging Face id needs huggingface_hub: pip install 'recipegen[hf]' "
                         "(or give a local config.json / checkpoint folder)") from None
    return huggingface_hub


@contextmanager
def staged_checkpoint(repo_id: str, revision: str | None) -> Iterator[HubCheckpoint]:
    """The checkpoint's metadata staged in a temporary folder (removed afterwards)."""
    hub = _hub()
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}" + (f"@{revision}" if revision else "")
    offline = bool(constants.HF_HUB_OFFLINE)
    unresolved = None if offline else _unresolved_host(constants.ENDPOINT)
    # a host that does not resolve will not answer: read the cache only, at once (the hub client
    # would retry for about 25 s first)
    cache_only = offline or unresolved is not None
    try:
        config = Path(hub.hf_hub_download(repo_id, CONFIG, revision=revision, local_files_only=cache_only))
    except GatedRepoError:
        raise InputError("a gated model: accept its terms on the hub and set HF_TOKEN", file=where) from None
    except RepositoryNotFoundError:
        raise InputError("no such model on the hub (or a private one: set HF_TOKEN)", file=where) from None
    except RevisionNotFoundError:
        raise InputError(f"no revision {revision!r} of this model on the hub", file=where) from None
    except LocalEntryNotFoundError:
        how = ("HF_HUB_OFFLINE=1 and config.json is not in the hub cache" if offline else
               f"cannot reach {constants.ENDPOINT}{f' ({unresolved})' if unresolved else ''} and config.json "
               "is not in the hub cache")
        raise InputError(f"{how} ({constants.HF_HUB_CACHE}): run once online, or give a local checkpoint "
                         "folder", file=where) from None
    except EntryNotFoundError:
        raise InputError("the model has no config.json", file=where) from None
    except HfHubHTTPError as exc:
        raise InputError(f"the hub answered {exc.response.status_code if exc.response is not None else 'an error'} "
                         "for config.json", file=where) from None
    commit = config.parent.name
    folder = Path(tempfile.mkdtemp(prefix="recipegen-hub-"))
    try:
        staged = HubCheckpoint(repo_id, revision, commit, folder)
        shutil.copyfile(config, folder / CONFIG)
        staged.files.append(CONFIG)
        for name in (QUANT, INDEX):
            found = _optional(hub, repo_id, name, commit, cache_only, staged)
            if found is not None:
                shutil.copyfile(found, folder / name)
                staged.files.append(name)
        if unresolved is not None:
            staged.notes.append(f"read from the hub cache only: {unresolved}")
        if INDEX in staged.files:
            _stage_shard_headers(hub, staged, cache_only)
        yield staged
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _unresolved_host(endpoint: str) -> str | None:
    """Why the endpoint's host name does not resolve (None: it does, or there is none to check)."""
    import socket
    from urllib.parse import urlsplit

    host = urlsplit(endpoint).hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        return f"its host name {host} does not resolve: {getattr(exc, 'strerror', None) or exc}"
    return None


def _optional(hub, repo_id: str, name: str, commit: str, offline: bool, staged: HubCheckpoint) -> Path | None:
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return Path(hub.hf_hub_download(repo_id, name, revision=commit, local_files_only=offline))
    except LocalEntryNotFoundError:
        from huggingface_hub.file_download import _CACHED_NO_EXIST  # the cache's "known absent" marker

        known_absent = hub.try_to_load_from_cache(repo_id, name, revision=commit) is _CACHED_NO_EXIST
        if not known_absent:
            staged.notes.append(f"{name}: not in the hub cache (offline), read as absent")
        return None
    except EntryNotFoundError:
        return None


def _stage_shard_headers(hub, staged: HubCheckpoint, offline: bool) -> None:
    index = json.loads((staged.folder / INDEX).read_text(encoding="utf-8"))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return  # the importer names the problem
    shards = sorted({s for s in weight_map.values() if isinstance(s, str)})
    headers: dict[str, bytes] = {}
    for shard in shards:
        if "/" in shard or shard in ("", ".", ".."):
            raise InputError(f"shard name {shard!r} is not a file name", file=f"{staged.ref}/{INDEX}")
        cached = hub.try_to_load_from_cache(staged.repo_id, shard, revision=staged.commit)
        if isinstance(cached, str):
            headers[shard] = _header_of_file(Path(cached))
        elif not offline:
            headers[shard] = _header_over_http(hub, staged, shard)
        else:
            staged.notes.append(f"shard headers not read: offline and {shard} is not in the hub cache; "
                                "dense bytes come from the index's total_size")
            return
    for shard, header in headers.items():
        (length,) = struct.unpack("<Q", header[:8])
        tensors = json.loads(header[8:])
        ends = [int(v["data_offsets"][1]) for k, v in tensors.items() if k != "__metadata__"]
        with open(staged.folder / shard, "wb") as f:
            f.write(header)
            f.truncate(8 + length + max(ends, default=0))  # the shard's size, its data a hole
    staged.notes.append(f"{format_count(len(headers), 'shard header')} read, no tensor data")


def _header_of_file(path: Path) -> bytes:
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise InputError("too short for a safetensors header", file=str(path))
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER:
            raise InputError(f"header length {length} is not plausible", file=str(path))
        return head + f.read(length)


def _header_over_http(hub, staged: HubCheckpoint, shard: str) -> bytes:
    """The shard's header as its bytes, from huggingface_hub's range-request parser."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        meta = hub.HfApi().parse_safetensors_file_metadata(staged.repo_id, shard, revision=staged.commit)
    except HfHubHTTPError as exc:
        raise InputError(f"the hub answered {exc.response.status_code if exc.response is not None else 'an error'} "
                         "for its header", file=f"{staged.ref}/{shard}") from None
    except Exception as exc:  # the library's SafetensorsParsingError and the like
        raise InputError(f"cannot read its safetensors header: {type(exc).__name__}: {str(exc)[:200]}",
                         file=f"{staged.ref}/{shard}") from None
    header: dict[str, object] = {}
    if meta.metadata:
        header["__metadata__"] = meta.metadata
    for name, info in meta.tensors.items():
        header[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob
