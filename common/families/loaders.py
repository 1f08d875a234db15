"""Loading models from local directories only.

No model hub is reachable from our machines, and a hub lookup would otherwise
hang on DNS retries: every loader resolves a local directory first and fails at
once, naming the path, when it is missing. The same code loads FLUX.1-dev and
real reward checkpoints on a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import ModelPathError  # raised here; importers find it here too

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_local_dir(path: str | Path, what: str, required: Iterable[str] = ()) -> Path:
    """The existing local directory ``path`` holding ``required`` files, or a clear error."""
    p = Path(path).expanduser()
    if not p.exists():
        hint = ""
        if _HUB_ID.match(str(path)):
            hint = (
                " — it looks like a hub id, but no hub is reachable here: download the "
                "checkpoint elsewhere and pass its local directory"
            )
        raise ModelPathError(f"{what}: local directory {str(path)!r} does not exist{hint}")
    if not p.is_dir():
        raise ModelPathError(f"{what}: {str(path)!r} is not a directory")
    missing = [name for name in required if not (p / name).exists()]
    if missing:
        raise ModelPathError(f"{what}: {str(path)!r} lacks {', '.join(missing)}")
    return p
