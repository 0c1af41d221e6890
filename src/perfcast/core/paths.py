"""Where perfcast's local stores live by default."""

from __future__ import annotations

import os
from pathlib import Path


def store_root(env: str, folder: str) -> Path:
    """`$env` when set, else `<user data dir>/perfcast/<folder>`."""
    value = os.environ.get(env)
    if value:
        return Path(value)
    import platformdirs

    return Path(platformdirs.user_data_dir("perfcast")) / folder
