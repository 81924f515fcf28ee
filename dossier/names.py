"""Names and target paths: what a name read from a release spec, a bundle or a registry may be,
and the check that a path built from one stays inside the folder it is meant for.

A release name is the spec's rule (:data:`RELEASE_NAME`): letters, digits, ``.``, ``_`` and
``-``, starting with a letter or digit, at most 100 characters; so ``NAME-VERSION.dossier`` is
one plain folder name. A file name (the model's) is one path component without a separator,
control character or backslash. Whatever is built from such names is checked once more, after
resolution, by :func:`inside`: a target that resolves outside its folder (a link on the way, a
name that slipped through) is refused before anything is written. Folders that hold what this
host will run or trust (the build cache, the registry cache) must be this user's own:
:func:`folder_problem`.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from dossier.errors import BundleFormatError

RELEASE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A release name: letters, digits, '.', '_' and '-', starting with a letter or digit."""
RELEASE_NAME_MAX = 100
"""The longest release name."""
RELEASE_VERSION_MAX = 2**31 - 1
"""The highest release version."""
FILE_NAME_MAX = 255
"""The longest file name, in UTF-8 bytes (the usual file system limit)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL, C1, a Unicode line separator)."""
    return _CONTROL.search(text) is not None


def check_file_name(name: str) -> str:
    """``name`` when it is one plain file name; ValueError otherwise."""
    if (not name or name in (".", "..") or "/" in name or "\\" in name or has_control(name)
            or len(name.encode("utf-8", "surrogatepass")) > FILE_NAME_MAX):
        raise ValueError(f"{name!r} is not a plain file name (no folder, no control character)")
    return name


def inside(folder: Path, target: Path, what: str) -> Path:
    """``target`` when it resolves to a path inside ``folder`` (both resolved, links followed
    as far as they exist); BundleFormatError (exit 6) otherwise, naming ``what``."""
    base = Path(os.path.realpath(folder))
    resolved = Path(os.path.realpath(target))
    if resolved == base or base not in resolved.parents:
        raise BundleFormatError(f"{what}: {str(target)[:200]!r} would lie outside {folder}; "
                                "refused, nothing was written",
                                hint="the bundle's names are crafted; do not use it")
    return target


def folder_problem(path: Path) -> str | None:
    """Why the folder ``path`` must not be trusted with code or bundles (not a folder but a
    link or a file, owned by another user, writable by group or others), or None when it is
    this user's own. The rule ssh applies to its keys; the build cache and the registry cache
    apply it to their top folder and to every entry folder."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder (a link or a file)"
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"may be written by others (owner uid {st.st_uid}, mode "
                f"{stat.filemode(st.st_mode)})")
    return None


__all__ = ["FILE_NAME_MAX", "RELEASE_NAME", "RELEASE_NAME_MAX", "RELEASE_VERSION_MAX",
           "check_file_name",
           "folder_problem", "has_control", "inside"]
