"""The kernel's build configuration, read only to explain why a probed feature is missing."""

from __future__ import annotations

import os


def kernel_config(root: str, release: str) -> dict[str, str]:
    """CONFIG_* values from /proc/config.gz or /boot/config-<release>; empty when neither exists."""
    import gzip  # only to explain a missing feature: not at every start
    text = ""
    try:
        with gzip.open(os.path.join(root, "proc/config.gz"), "rt") as f:
            text = f.read()
    except OSError:
        try:
            with open(os.path.join(root, f"boot/config-{release}")) as f:
                text = f.read()
        except OSError:
            return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_"):
            key, _, value = line.partition("=")
            out[key] = value
        elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
            out[line[2:-len(" is not set")]] = "n"
    return out


def config_off(config: dict[str, str], option: str) -> bool:
    return config.get(option) == "n"
