"""Ed25519 key pairs for signing bundles: made (``dossier keygen``), written once with
owner-only permissions, and read back as untrusted input (size-bounded, one clear line on a
file that is not the key it should be). :mod:`dossier.trust.signing` signs and checks with
them."""

from __future__ import annotations

import binascii
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dossier.diskfull import output_error
from dossier.errors import BackendUnavailableError, InputError, OutputError
from dossier.hashing import BLAKE3, new_hasher

PRIVATE_KEY_SUFFIX = ".key"
PUBLIC_KEY_SUFFIX = ".pub"
_HINT_INSTALL = "pip install 'dossier[sign]' (cryptography and blake3)"


def crypto() -> Any:
    """The ``cryptography`` package's Ed25519 module; BackendUnavailableError without it."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the [sign] extra is installed in CI
        raise BackendUnavailableError("signing needs the cryptography package",
                                      hint=_HINT_INSTALL) from None
    return ed25519


def blake3_bytes(data: bytes) -> str:
    """BLAKE3 (256-bit, lowercase hex) of ``data``."""
    h = new_hasher(BLAKE3)
    h.update(memoryview(data))
    return h.hexdigest()


# -------------------------------------------------------------------------------------- keys
@dataclass(frozen=True)
class KeyPair:
    """A key pair written by :func:`generate_key_pair`."""

    private: Path
    """PEM, PKCS#8, unencrypted, mode 0600."""
    public: Path
    """PEM, SubjectPublicKeyInfo: what verifiers pass as ``--trusted-key``."""
    keyid: str
    """The key's id in signatures."""


def key_id(public_key: Any) -> str:
    """Lowercase hex BLAKE3 of the raw 32-byte Ed25519 public key."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return blake3_bytes(raw)


def generate_key_pair(out_dir: Path, name: str = "dossier") -> KeyPair:
    """Write a new Ed25519 key pair as ``out_dir/NAME.key`` (mode 0600) and ``NAME.pub``.

    Existing files are never replaced (OutputError). The private key file is created with mode
    0600 from the start, so it is never readable by others, not even for a moment.
    """
    from cryptography.hazmat.primitives import serialization

    ed25519 = crypto()
    if not name or "/" in name or name.startswith("."):
        raise InputError(f"key name {name!r} must be a plain file name")
    out_dir = Path(out_dir)
    private = out_dir / f"{name}{PRIVATE_KEY_SUFFIX}"
    public = out_dir / f"{name}{PUBLIC_KEY_SUFFIX}"
    for path in (private, public):
        if os.path.lexists(path):
            raise OutputError(f"{path} exists already", hint="keys are never overwritten")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_new(private, private_pem, 0o600)
        try:
            _write_new(public, public_pem, 0o644)
        except BaseException:
            private.unlink(missing_ok=True)
            raise
    except FileExistsError as exc:
        raise OutputError(f"{exc.filename} exists already", hint="keys are never overwritten") from None
    except OSError as exc:
        raise output_error(exc, out_dir, "writing the key pair",
                           f"write the key pair into {out_dir}") from exc
    return KeyPair(private, public, key_id(key.public_key()))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; never adds any here
        view = memoryview(data)
        while view:  # a short write is not an error; a full disk raises
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        path.unlink(missing_ok=True)  # no half-written key is left
        raise
    finally:
        os.close(fd)


def _read_key_file(path: Path, what: str) -> bytes:
    from dossier.files import read_small

    try:
        return read_small(path, 64 << 10)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise InputError(f"{path} is not a PEM {what} (larger than 64 KiB)") from exc
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def load_private_key(path: Path) -> Any:
    """The Ed25519 private key in the PEM file ``path``; InputError if it is not one."""
    from cryptography.hazmat.primitives import serialization

    ed25519 = crypto()
    data = _read_key_file(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise InputError(f"{path} is an encrypted private key; dossier reads unencrypted PEM "
                         "keys only", hint="keep the key in a secret store that hands it "
                         "to the signing job; dossier keygen writes one") from None
    except (ValueError, binascii.Error) as exc:
        raise InputError(f"{path} is not a PEM private key ({_one_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - cryptography raises its own types for odd PEM
        raise InputError(f"{path} is not a PEM private key ({_one_line(exc)})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise InputError(f"{path} is not an Ed25519 private key ({type(key).__name__})",
                         hint="dossier keygen --out DIR writes one")
    return key


def load_public_key(path: Path) -> Any:
    """The Ed25519 public key in the PEM file ``path``; InputError if it is not one."""
    from cryptography.hazmat.primitives import serialization

    ed25519 = crypto()
    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except Exception as exc:  # noqa: BLE001 - ValueError, UnsupportedAlgorithm, ...
        hint = " (that is a private key: pass the .pub file)" if b"PRIVATE KEY" in data else ""
        raise InputError(f"{path} is not a PEM public key{hint} ({_one_line(exc)})") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise InputError(f"{path} is not an Ed25519 public key ({type(key).__name__})")
    return key


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
