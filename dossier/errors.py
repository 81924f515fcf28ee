"""Errors and exit codes.

Every error the library raises on purpose derives from :class:`DossierError`. Its message says
what is wrong; :meth:`DossierError.diagnostics` adds what to do about it. The CLI prints one line
and exits with the error's :attr:`exit_code`.

Hierarchy::

    DossierError
    ├── InputError                 bad input from the user (exit 3)
    │   ├── SpecError              release.toml missing, malformed or inconsistent
    │   ├── ModelError             model file missing, unreadable or malformed
    │   ├── ValidationSetError     pairs that do not fit the model, NaN/Inf references, ...
    │   ├── SelectionError         unknown knob, value not allowed, duplicate, empty selection
    │   └── CacheMismatchError     --continue against a cache whose inputs changed
    ├── TuneError                  the search could not produce a result (exit 4)
    ├── BackendUnavailableError    the backend's library is not installed here (exit 5)
    ├── BundleError                unreadable, unknown-format, corrupt or tampered bundle (exit 6)
    │   ├── BundleFormatError      not a bundle, or a format version this reader does not know
    │   ├── IntegrityError         a file is missing, extra or altered
    │   │   └── DigestMismatchError  a blob pulled from a registry does not match its digest
    │   └── UnsafeArchiveError     a .dossier.tar member that would write outside its target
    ├── OutputError                output exists or cannot be written (exit 7)
    ├── SignatureError             unsigned, wrongly signed or altered bundle (exit 13)
    ├── VerdictError               dossier.load refuses an engine for this host's verdict
    │   ├── InvalidHostError       INVALID here (exit 11)
    │   └── SuboptimalHostError    SUBOPTIMAL here, and asked to refuse it (exit 10)
    ├── EngineFailedError          a verified engine did not load or run here (exit 11)
    ├── RegistryError              registry unreachable, failed or refused a request (exit 20)
    │   ├── RegistryAuthError      credentials missing or refused (exit 21)
    │   └── NotFoundError          no such repository, tag or digest in the registry (exit 22)
    ├── DiskFullError              a file system ran out of space or quota (exit 74)
    └── BusyError                  another dossier process holds the run folder or bundle (exit 75)

Anything else that escapes is a bug in dossier itself: the CLI exits 70 (``ExitCode.INTERNAL``).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes of the ``dossier`` command. Documented in docs/exit-codes.md."""

    OK = 0
    """Success; for ``verify``: every field VALID."""
    DRIFT = 1
    """``schema --check``: a schema file differs from what the models generate (or is missing
    or extra); regenerate it with ``dossier schema``."""
    USAGE = 2
    """Command-line usage error (unknown option, missing argument)."""
    INPUT = 3
    """Bad input: spec, model, validation set, selection, knob, cache mismatch."""
    TUNE = 4
    """The search could not produce a result (e.g. the default route fails)."""
    BACKEND_UNAVAILABLE = 5
    """The backend's library is not installed on this host."""
    BUNDLE = 6
    """Bundle unreadable, of an unknown format, corrupt or tampered."""
    OUTPUT = 7
    """Output exists already or cannot be written."""
    SUBOPTIMAL = 10
    """``verify``: the engine loads here, but the tuning may no longer be optimal."""
    INVALID = 11
    """``verify``: the engine must not be used here (rebuild or re-tune)."""
    CONDITIONS = 12
    """``release --strict-conditions``: the bundle is written, but its figures are not
    comparable with the spec's declared ``[target]`` (a measurement ran busier than declared,
    or a conditional route shipped)."""
    SIGNATURE = 13
    """Signature missing, not trusted or not matching."""
    REGISTRY = 20
    """An OCI registry is unreachable, failed (HTTP 5xx, died mid-transfer) or refused a request."""
    REGISTRY_AUTH = 21
    """An OCI registry wants credentials that are missing, or refused the ones given."""
    NOT_FOUND = 22
    """The repository, tag or digest is not in the registry."""
    INTERNAL = 70
    """A bug in dossier itself."""
    DISK_FULL = 74
    """A file system is full (ENOSPC), over quota (EDQUOT) or a file over the size limit
    (EFBIG): the host's fault, nothing false was recorded; free space and run again."""
    BUSY = 75
    """Another dossier process holds the run folder or the bundle being written (its pid is
    named); wait for it or choose another folder."""
    INTERRUPTED = 130
    """Interrupted by the user (Ctrl-C); whatever was finished is kept."""


_ONE_LINE = {c: repr(chr(c))[1:-1] for c in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)
             if c != 0x09}
"""Line breaks and other control characters, escaped: a message is one line even when it
quotes hostile input (a JSON key holding a newline)."""


class DossierError(Exception):
    """Base type of every error dossier raises on purpose."""

    exit_code: ExitCode = ExitCode.INPUT
    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(str(message).translate(_ONE_LINE))
        if hint is not None:
            self.hint = str(hint).translate(_ONE_LINE)

    def diagnostics(self) -> str:
        """The message plus what to do about it, for a person."""
        text = str(self)
        return f"{text} ({self.hint})" if self.hint else text


class InputError(DossierError):
    """Bad input from the user."""

    exit_code = ExitCode.INPUT


class SpecError(InputError):
    """A release spec (release.toml) is missing, malformed or inconsistent."""


class ModelError(InputError):
    """A model file is missing, unreadable or malformed."""


class ValidationSetError(InputError):
    """A validation set does not fit the model or holds unusable references."""


class SelectionError(InputError):
    """A selection names an unknown knob, a value not allowed, a duplicate, or nothing."""


class CacheMismatchError(InputError):
    """A tuning cache does not match the inputs it is asked to continue with."""

    hint = "start a new search with another --out, or restore the original inputs"


class TuneError(DossierError):
    """The search could not produce a result."""

    exit_code = ExitCode.TUNE


class BackendUnavailableError(DossierError):
    """The backend's library is not installed on this host."""

    exit_code = ExitCode.BACKEND_UNAVAILABLE


class BundleError(DossierError):
    """A bundle cannot be used."""

    exit_code = ExitCode.BUNDLE


class BundleFormatError(BundleError):
    """Not a bundle, or a bundle of a format version this reader does not know."""


class IntegrityError(BundleError):
    """A bundle file is missing, extra or altered."""

    hint = "the bundle is corrupt or was modified after it was written; fetch it again"


class UnsafeArchiveError(BundleError):
    """A .dossier.tar member would write outside its target, or lies about its size."""

    hint = "the archive was not written by dossier pack; do not use it"


class DigestMismatchError(IntegrityError):
    """A blob or manifest pulled from a registry does not match its sha256 digest or size."""

    hint = "the registry's copy is corrupt or was tampered with; nothing was kept"


class OutputError(DossierError):
    """Output exists already or cannot be written."""

    exit_code = ExitCode.OUTPUT


class SignatureError(DossierError):
    """A bundle's signature is missing, untrusted or does not match."""

    exit_code = ExitCode.SIGNATURE


class VerdictError(DossierError):
    """The environment verdict of this host refuses the engine (:func:`dossier.load`)."""

    exit_code = ExitCode.INVALID


class InvalidHostError(VerdictError):
    """The engine must not be used on this host (verify's INVALID)."""

    exit_code = ExitCode.INVALID


class SuboptimalHostError(VerdictError):
    """The engine loads here but its tuning may no longer be the fastest (verify's
    SUBOPTIMAL), and the caller asked to refuse that."""

    exit_code = ExitCode.SUBOPTIMAL


class EngineFailedError(DossierError):
    """A verified engine did not load or run on this host (:func:`dossier.load`, ``dossier
    run``): it must not be used here, as an INVALID verdict."""

    exit_code = ExitCode.INVALID


class RegistryError(DossierError):
    """An OCI registry is unreachable, failed or refused a request."""

    exit_code = ExitCode.REGISTRY


class RegistryAuthError(RegistryError):
    """An OCI registry wants credentials that are missing, or refused the ones given."""

    exit_code = ExitCode.REGISTRY_AUTH
    hint = ("log in with docker login (DOCKER_CONFIG or ~/.docker/config.json), or set "
            "DOSSIER_REGISTRY_USERNAME and DOSSIER_REGISTRY_PASSWORD")


class NotFoundError(RegistryError):
    """The repository, tag or digest is not in the registry."""

    exit_code = ExitCode.NOT_FOUND


class DiskFullError(DossierError):
    """A file system ran out of space or quota, or a file hit the size limit: the host's
    fault, not the input's. Nothing false is recorded; run again once there is room."""

    exit_code = ExitCode.DISK_FULL
    hint = "free space there (or point TMPDIR / --out elsewhere) and run the command again"


class BusyError(DossierError):
    """Another dossier process holds the lock of a run folder or of a bundle being written."""

    exit_code = ExitCode.BUSY
    hint = "wait for it to finish, or use another folder"
