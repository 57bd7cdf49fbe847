"""One build and one eager run per class for all the backends of a run (``--backend`` naming several).

Each case runs in its own child process, so a class's eager, dynamo, onnx and executorch cases each built the
model and ran it eagerly again. With several backends the run has a shared folder: the first case of a class to
start claims it (an exclusive lock file), builds, runs eager at every shape the backends compare, and writes the
built case with those outputs there; the class's other cases wait for that file and load it instead. What they
load is what they would have built (the same pickled model, inputs and eager outputs), so statuses do not change;
a class whose case cannot be pickled, or whose first case failed before writing it, is built by each case as
before. The controller removes a class's file once all its cases have reported, and the folder at the end.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

#: a case that finds its class claimed waits this long for the claimant's file, then builds the class itself
WAIT_SECONDS = 300.0
_POLL_SECONDS = 0.2


def class_file(folder: str | os.PathLike, model: str, seed: int) -> Path:
    """The shared file of one class (and seed) in the run's folder."""
    safe = re.sub(r"[^\w.@-]", "_", model)
    return Path(folder) / f"{safe}-seed{seed}.pt"


def _marker(path: Path, kind: str) -> Path:
    return path.with_name(f"{path.name}.{kind}")


def claim_or_load(path: Path, wait: float = WAIT_SECONDS) -> tuple[dict | None, bool]:
    """``(payload, claimed)``: this case claims the class (``claimed``: it builds and must :func:`store` or
    :func:`give_up`), or gets the payload another case stored, or ``(None, False)``: it builds the class itself
    (the claimant gave up, or did not finish within ``wait`` seconds)."""
    import torch

    lock = _marker(path, "lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return None, True
    except FileExistsError:
        pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return torch.load(path, weights_only=False), False
            except Exception:  # a file that does not load: build as if there were none
                return None, False
        if _marker(path, "failed").exists() or not _alive(lock):
            return None, False
        time.sleep(_POLL_SECONDS)
    return None, False


def _alive(lock: Path) -> bool:
    """Whether the claimant (its pid is the lock's content) still runs: a case killed or crashed in build or
    eager never stores nor gives up."""
    try:
        pid = int(lock.read_text() or 0)
    except (OSError, ValueError):
        return True  # being written
    if not pid:  # created, its pid not written yet
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def store(path: Path, payload: dict[str, Any]) -> bool:
    """Write ``payload`` atomically (a half-written file is never read); False, and the class marked as built by
    each case, when it cannot be pickled."""
    import torch

    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
        return True
    except Exception:
        tmp.unlink(missing_ok=True)
        give_up(path)
        return False


def give_up(path: Path) -> None:
    """The claimant will not write the file: the cases waiting for it build the class themselves."""
    _marker(path, "failed").touch()


def remove(path: Path) -> None:
    """Remove one class's file and markers (all its cases have reported)."""
    for file in (path, _marker(path, "lock"), _marker(path, "failed")):
        file.unlink(missing_ok=True)
