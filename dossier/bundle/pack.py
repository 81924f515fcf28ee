"""Packing a bundle as one file, ``NAME-VERSION.dossier.tar``.

Packing is deterministic: members in a fixed order (the bundle folder, its manifest, then every
folder and file sorted by path), mtime 0, uid/gid 0, empty owner names, mode 0644 for files
and 0755 for folders, POSIX (pax) format that only adds a pax header where USTAR cannot hold a
field (a long path, a member over 8 GiB), never a timestamp. The same bundle gives the same bytes.
Reading an archive back: :mod:`dossier.bundle.archive`.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from dossier.bundle.integrity import require_intact
from dossier.bundle.manifest import ARCHIVE_SUFFIX, BUNDLE_SUFFIX, MANIFEST_NAME
from dossier.bundle.reader import Bundle, open_bundle
from dossier.diskfull import output_error
from dossier.errors import OutputError
from dossier.files import begin_staging, fsync_path, rename_noreplace
from dossier.hashing import CHUNK
from dossier.lock import bundle_lock
from dossier.names import inside


def archive_name(bundle: Bundle) -> str:
    """``NAME-VERSION.dossier.tar``."""
    return bundle.manifest.name + ARCHIVE_SUFFIX


def pack_bundle(path: Path, out_dir: Path) -> Path:
    """Write the bundle at ``path`` (folder or archive) as ``out_dir/NAME-VERSION.dossier.tar``.

    The bundle must pass its integrity check first (IntegrityError otherwise); an existing
    archive is never replaced (OutputError). The archive is written under a staging name and
    renamed into place.
    """
    out_dir = Path(out_dir)
    with open_bundle(path) as bundle:
        require_intact(bundle, "not packed")
        target = inside(out_dir, out_dir / archive_name(bundle), str(bundle.source))
        if os.path.lexists(target):
            raise OutputError(f"{target} exists already", hint="archives are never overwritten")
        with bundle_lock(out_dir, target.name):  # one writer of this archive at a time
            _commit_archive(bundle, out_dir, target)
    return target


def _commit_archive(bundle: Bundle, out_dir: Path, target: Path) -> None:
    staging = begin_staging(out_dir, target.name, directory=False)
    try:
        with open(staging, "xb") as f:
            write_archive(bundle, f)
            f.flush()
            os.fsync(f.fileno())
        rename_noreplace(staging, target)
        fsync_path(out_dir)
    except FileExistsError:
        staging.unlink(missing_ok=True)
        raise OutputError(f"{target} appeared while the archive was written") from None
    except OSError as exc:
        staging.unlink(missing_ok=True)
        raise output_error(exc, out_dir, f"writing {target.name}", f"write {target}") from exc
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def write_archive(bundle: Bundle, fileobj: object) -> None:
    """Write ``bundle`` as a deterministic tar stream into the binary file ``fileobj``."""
    root = bundle.manifest.name + BUNDLE_SUFFIX
    files = bundle.manifest.table()
    folders = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                      encoding="utf-8", copybufsize=CHUNK) as tar:
        tar.addfile(_info(root, directory=True))
        manifest = bundle.path / MANIFEST_NAME
        with open(manifest, "rb") as f:
            tar.addfile(_info(f"{root}/{MANIFEST_NAME}", size=os.fstat(f.fileno()).st_size), f)
        for rel in sorted(folders | set(files)):
            if rel in folders:
                tar.addfile(_info(f"{root}/{rel}", directory=True))
                continue
            with open(bundle.path / rel, "rb") as f:
                tar.addfile(_info(f"{root}/{rel}", size=files[rel].size), f)


def _info(name: str, *, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
