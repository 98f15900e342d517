"""A directory laid out and updated as kubelet does a ConfigMap volume, for the agent's config watch tests."""

from __future__ import annotations

import os
import time
from pathlib import Path


def configmap_update(mount: Path, files: dict[str, str]) -> None:
    """One update (the first makes the volume): the files in a new timestamped directory, a new `..data` symlink
    renamed over the old one at once, each name a symlink into `..data`, then the old directory removed."""
    mount.mkdir(exist_ok=True)
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S", time.gmtime()) + f".{time.monotonic_ns() % 10**9:09d}"
    new = mount / stamp
    new.mkdir()
    for name, text in files.items():
        (new / name).write_text(text)
    data = mount / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    os.symlink(stamp, mount / "..data_tmp")
    os.rename(mount / "..data_tmp", data)
    for name in files:
        if not (mount / name).is_symlink():
            os.symlink(f"..data/{name}", mount / name)
    if old is not None:
        for f in (mount / old).iterdir():
            f.unlink()
        (mount / old).rmdir()
