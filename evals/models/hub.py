"""A model by its hub id: its folder in the local HF cache, downloaded only when the hub is not offline
(evals.offline.hub_offline)."""

from __future__ import annotations

from pathlib import Path

from evals.errors import ModelError
from evals.offline import hub_mode, hub_offline


def hub_folder(hub_id: str) -> Path:
    """A hub id's snapshot folder: usable only if it is already in the local HF cache while offline."""
    offline = hub_offline()
    try:
        from huggingface_hub import snapshot_download  # huggingface_hub: only for a hub id

        with hub_mode(offline):
            folder = snapshot_download(hub_id, local_files_only=offline)
    except Exception:  # noqa: BLE001 - any hub failure means "not available here"
        how = ("set HF_HUB_OFFLINE=0 to download it, or pass a local folder" if offline
               else "check the id and your network, or pass a local folder")
        raise ModelError(f"model {hub_id!r} is not available locally; {how}") from None
    return Path(folder)
