"""Where the artifact goes: nothing already there is ever lost, and --out always holds a whole one.

- `check_out`: --out must be absent, an empty folder, or an artifact an export wrote (its
  manifest lists exactly the files there). Anything else is refused unless --force, and then it
  is moved aside to `<out>.replaced-<time>`, never deleted. --out equal to, inside, or holding
  the checkpoint is always refused. A missing parent must be makeable.
- `staging`: everything is built in a temporary folder beside --out (its missing parents
  made), `.<name>.export-<pid>-*`, removed on any exit (an exception, Ctrl-C, SIGTERM raised as
  an exception by the command).
  A folder left by a killed export (its pid gone) is removed by the next export to that --out.
- `publish`: the new artifact replaces the old one by an atomic exchange of the two folders
  (Linux renameat2), then the old one is removed. Where the exchange is unsupported, two renames
  with the old folder parked as `.<name>.old-<pid>-x` between them; an interrupted exchange puts
  it back, and the next export restores it if --out is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lsan.artifact import is_artifact
from lsan.export import ExportError


def _pid_gone(name: str) -> bool:
    """For `.<out>.export-<pid>-<x>` / `.<out>.old-<pid>-<x>`: has process <pid> ended?"""
    try:
        os.kill(int(name.rsplit("-", 2)[-2]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def check_out(out: Path, ckpt: Path, force: bool) -> None:
    """Refuse an --out that could lose data (see the module docstring)."""
    where, ck = out.resolve(), Path(ckpt).resolve()
    if _inside(where, ck):
        raise ExportError(
            f"--out {out} is the checkpoint {ckpt} or inside it: choose another folder"
        )
    if _inside(ck, where):
        raise ExportError(f"--out {out} holds the checkpoint {ckpt}: choose another folder")
    # a missing parent (a fresh clone's artifacts/) is made by `staging`, once every input has
    # been checked; here only that it can be: its nearest existing ancestor is a writable folder
    have = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    if not have.is_dir():
        raise ExportError(f"cannot make the output folder {out.parent}: {have} is not a folder")
    if not os.access(have, os.W_OK):
        raise ExportError(f"output folder {have} is not writable")
    if not force and not replaceable(out):
        what = "a file" if not out.is_dir() else "a folder that is not an artifact"
        raise ExportError(f"--out {out} is {what} (nothing replaced; empty it, choose another "
                          "folder, or pass --force to move it aside)")  # fmt: skip


def replaceable(out: Path) -> bool:
    """Absent, an empty folder, or an export's artifact (nothing else there)."""
    if not out.exists() and not out.is_symlink():
        return True
    if out.is_symlink() or not out.is_dir():
        return False
    return not any(out.iterdir()) or is_artifact(out)


def clean_stale(out: Path, log: Callable[[str], None]) -> None:
    """Remove what killed exports to `out` left; put back an old artifact a crash parked."""
    for path in sorted(out.parent.glob(f".{out.name}.old-*")):
        if _pid_gone(path.name):
            if not out.exists() and not out.is_symlink():
                os.rename(path, out)
                log(f"restored {out} from an interrupted replacement")
            else:
                shutil.rmtree(path)
    for path in out.parent.glob(f".{out.name}.export-*"):
        if _pid_gone(path.name):
            shutil.rmtree(path, ignore_errors=True)
            log(f"removed {path.name}, left by an export that was killed")


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` (same filesystem: the swap is a rename), always removed;
    `out`'s missing parents are made first, as `lsan train --out` makes its folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-{os.getpid()}-", dir=out.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    fn = (
        getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        if sys.platform == "linux"
        else None
    )
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # e.g. a filesystem without it
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish(
    new: Path, out: Path, force: bool, log: Callable[[str], None],
    hook: Callable[[str], None] = lambda stage: None,
) -> None:  # fmt: skip
    """Move the finished artifact `new` to `out` without a moment where `out` is incomplete."""
    if not out.exists() and not out.is_symlink():
        os.rename(new, out)
        return
    if not replaceable(out):
        if not force:  # it changed since check_out
            raise ExportError(f"--out {out} is no longer an artifact: nothing replaced")
        stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
        aside = out.with_name(f"{out.name}.replaced-{stamp}")
        while aside.exists() or aside.is_symlink():
            n += 1
            aside = out.with_name(f"{out.name}.replaced-{stamp}-{n}")
        os.rename(out, aside)
        log(f"moved what was in {out} aside to {aside} (--force)")
        os.rename(new, out)
        return
    if _exchange(new, out):
        shutil.rmtree(new)  # the old artifact, now at the new one's temporary name
        return
    parked = out.with_name(f".{out.name}.old-{os.getpid()}-x")
    os.rename(out, parked)
    try:
        hook("swap")
        os.rename(new, out)
    except BaseException:
        if not out.exists():
            os.rename(parked, out)
        raise
    shutil.rmtree(parked)
