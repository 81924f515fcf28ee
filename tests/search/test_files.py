"""Small files (``dossier/files.py``): a FIFO where dossier reads a small file (the signature
beside a bundle, a trusted key, a host fingerprint, a policy, ``run -i``'s inputs) is refused at
once, without a traceback; ``read_small`` opens without blocking and refuses what is not a
regular file of bounded size (a FIFO, a folder, a link when told not to follow one). A FIFO for
a release spec is in test_spec.py, one in the build cache in test_build_cache.py.

Every case here failed before its fix; the docstrings say how."""

from __future__ import annotations

from pathlib import Path

import _bundles as h
import pytest
from _hostile import _fifo, _within

import dossier
from dossier.errors import ExitCode

FIFOS = ["signature beside", "trusted key", "--host-fingerprint", "run -i", "policy"]


@pytest.mark.parametrize("where", FIFOS)
def test_a_fifo_where_a_small_file_is_read_is_refused_at_once(bundle: Path, host: Path,
                                                              tmp_path: Path, where: str) -> None:
    """Before: verify, run, sign and dossier.load waited for ever on a FIFO in place of the
    signature beside the bundle, a trusted key, a host fingerprint or run's inputs."""
    from dossier.trust.sigfile import signature_path

    fifo = tmp_path / "fifo"
    args: list[object]
    if where == "signature beside":
        _fifo(signature_path(bundle))
        args, code = ["verify", bundle, "--host-fingerprint", host], ExitCode.SIGNATURE
    elif where == "trusted key":
        args = ["verify", bundle, "--host-fingerprint", host, "--trusted-key", _fifo(fifo),
                "--require-signature"]
        code = ExitCode.INPUT
    elif where == "--host-fingerprint":
        args, code = ["verify", bundle, "--host-fingerprint", _fifo(fifo)], ExitCode.INPUT
    elif where == "run -i":
        args = ["run", bundle, "--host-fingerprint", host, "-i", _fifo(fifo)]
        code = ExitCode.INPUT
    else:
        args = ["verify", bundle, "--host-fingerprint", host, "--policy", _fifo(fifo)]
        code = ExitCode.INPUT
    res = _within(20, lambda: h.cli(*args))
    assert not isinstance(res, BaseException), res
    assert res.exit_code == code, h.said(res)
    assert "Traceback" not in h.said(res)
    if where == "signature beside":
        for command in (["verify", bundle, "--integrity-only"],
                        ["sign", bundle, "--key", tmp_path / "none.key"]):
            res = _within(20, lambda c=command: h.cli(*c))
            assert not isinstance(res, BaseException), res
            assert res.exit_code != 0 and "Traceback" not in h.said(res)
        got = _within(20, lambda: dossier.load(bundle, host=host))
        assert isinstance(got, dossier.errors.SignatureError), got


def test_read_small_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    from dossier.files import NotAFileError, read_small

    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_small(tmp_path / "f", 10) == b"x" * 10
    with pytest.raises(NotAFileError, match="more than the 9"):
        read_small(tmp_path / "f", 9)
    got = _within(5, lambda: read_small(_fifo(tmp_path / "p")))
    assert isinstance(got, NotAFileError) and "FIFO" in str(got), got
    with pytest.raises(NotAFileError, match="folder"):
        read_small(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert read_small(tmp_path / "link") == b"x" * 10
    with pytest.raises(NotAFileError, match="symbolic link"):
        read_small(tmp_path / "link", follow=False)


def test_link_or_copy_links_on_one_file_system_and_copies_across(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from dossier.files import link_or_copy_hashed
    from dossier.hashing import digest_file

    src = tmp_path / "engine.bin"
    src.write_bytes(os.urandom(200_000))
    linked = link_or_copy_hashed(src, tmp_path / "linked")
    assert linked == digest_file(src) and (tmp_path / "linked").stat().st_nlink == 2

    def cross_device(*_a: object, **_k: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    copied = link_or_copy_hashed(src, tmp_path / "copied")
    assert copied == linked and (tmp_path / "copied").stat().st_nlink == 1
    with pytest.raises(FileExistsError):  # the new file only: never over another
        link_or_copy_hashed(src, tmp_path / "copied")
