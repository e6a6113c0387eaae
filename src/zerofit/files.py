"""write_files: the one place zerofit writes user files; atomic and never a half-written set."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from zerofit.errors import ZerofitError

OUT_ELSEWHERE = "choose another --out directory"


def refuse_existing(
    targets: list[Path], force: bool, field: str = "--out", elsewhere: str = OUT_ELSEWHERE
) -> None:
    """Refuse to write over ``targets``: a directory always, an existing file unless ``force``.

    Every zerofit writer checks its targets this way before it measures or writes anything, and
    names in the error the flag (``field``) that chose the target and where else to write
    (``elsewhere``, e.g. "choose another --facts-out file").
    """
    for target in targets:
        if target.is_dir():
            raise ZerofitError(field, f"{target} is a directory", f"remove it or {elsewhere}")
    existing = [target for target in targets if target.exists()]
    if existing and not force:
        listed = ", ".join(str(target) for target in existing)
        raise ZerofitError(
            field,
            f"{listed} already exist{'s' if len(existing) == 1 else ''}",
            f"pass --force to overwrite, or {elsewhere}",
        )


def write_files(
    outdir,
    files: dict[str, str],
    force: bool = False,
    field: str = "--out",
    elsewhere: str = OUT_ELSEWHERE,
) -> list[Path]:
    """Write ``files`` ({name: text}) into ``outdir``; return the written paths.

    Names may hold subdirectories. Every target is checked before anything is written
    (``refuse_existing``): without ``force`` an existing file aborts the whole set. Each file goes
    to a temporary file in the same directory first and is moved into place with ``os.replace``,
    so a reader never sees a truncated file. ``field`` and ``elsewhere`` word the errors for the
    flag that chose the target.
    """
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise ZerofitError(field, f"{out} exists and is not a directory", "give a directory path")
    targets = [out / name for name in files]
    for name in files:  # relative names only ("accelerate/zero2.yaml" is fine, "../x" is not)
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            raise ZerofitError(
                field, f"bad file name {name!r}", "use a relative name inside the directory"
            )
    refuse_existing(targets, force, field, elsewhere)
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZerofitError(
            field, f"cannot create {out} ({exc.strerror})", "choose a writable directory"
        ) from None
    # Stage every file first, then move them all into place: a failure while writing (disk full,
    # permissions) leaves the directory exactly as it was.
    staged: list[tuple[str, Path]] = []
    placed: list[Path] = []
    try:
        for target, text in zip(targets, files.values(), strict=True):
            staged.append((_write_temp(target, text, field), target))
        for tmp, target in staged:
            if force:
                os.replace(tmp, target)
            else:
                _place_exclusive(tmp, target, field, elsewhere)
                placed.append(target)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        for target in placed:  # only files this call created: no other file was touched
            target.unlink(missing_ok=True)
        raise
    return targets


def _place_exclusive(tmp: str, target: Path, field: str, elsewhere: str) -> None:
    """Move ``tmp`` to ``target`` only if ``target`` does not exist, atomically.

    The existence check above is not enough on its own: two ``zerofit config --out same`` started
    together both pass it, and the later ``os.replace`` silently overwrote the other's files.
    ``os.link`` fails with EEXIST instead, so exactly one writer wins each name.
    """
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise ZerofitError(
            field,
            f"{target} was created by someone else while zerofit wrote",
            f"pass --force to overwrite, or {elsewhere}",
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # A filesystem without hard links: claim the name with an exclusive create, then move
        # the finished file over our own (empty) claim.
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            raise ZerofitError(
                field,
                f"{target} was created by someone else while zerofit wrote",
                f"pass --force to overwrite, or {elsewhere}",
            ) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _write_temp(target: Path, text: str, field: str) -> str:
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise ZerofitError(
            field,
            f"cannot write in {target.parent} ({exc.strerror})",
            "choose a writable directory",
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(
            tmp, 0o644
        )  # mkstemp makes 0600; configs are shared with launchers and other nodes
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp
