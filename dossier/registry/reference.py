"""Registry references: ``REGISTRY/REPO:TAG`` and ``REGISTRY/REPO@sha256:HEX``.

The grammar is the distribution project's (``reference/regexp.go``): a registry host (a DNS
name, an IPv4 address or a bracketed IPv6 address, with an optional port), then one or more
lowercase path components, then a tag or a digest. Unlike docker there is no implicit registry
(docker.io) and no implicit tag (latest): a release is pushed to a registry the user names, under
a tag the user names. Only sha256 digests are accepted (the distribution spec's required
algorithm).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from dossier.errors import InputError

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?P<registry>{_HOST})/(?P<repository>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
"""A sha256 digest as OCI writes it."""
_EXAMPLE = "registry.example.com/team/convnet:1 or 127.0.0.1:5000/convnet@sha256:..."


@dataclass(frozen=True)
class Reference:
    """A parsed registry reference."""

    registry: str
    """Host, with its port if one was given (``127.0.0.1:5000``)."""
    repository: str
    """Repository path (``team/convnet``)."""
    tag: str | None = None
    """Tag, when one was given."""
    digest: str | None = None
    """``sha256:HEX``, when one was given (it wins over the tag when both are)."""

    @property
    def host(self) -> str:
        """The registry host without its port (IPv6 without brackets)."""
        host = self.registry
        if host.startswith("["):
            return host[1: host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def name(self) -> str:
        """``REGISTRY/REPO``."""
        return f"{self.registry}/{self.repository}"

    @property
    def target(self) -> str:
        """What the manifest URL names: the digest if given, else the tag."""
        target = self.digest or self.tag
        assert target is not None, "parse_reference guarantees a tag or a digest"
        return target

    def with_digest(self, digest: str) -> Reference:
        """The same repository, pinned to ``digest``."""
        return Reference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        return self.name + (f"@{self.digest}" if self.digest else f":{self.tag}")


def parse_reference(text: str, *, need_tag: bool = False) -> Reference:
    """Parse ``REGISTRY/REPO:TAG`` or ``REGISTRY/REPO@sha256:HEX``; InputError (exit 3) when
    ``text`` is not one, or (``need_tag``) names no tag."""
    m = _REFERENCE.match(text)
    if not m or not _is_registry(m["registry"]):
        raise InputError(f"{text!r} is not a registry reference REGISTRY/REPO:TAG or "
                         f"REGISTRY/REPO@DIGEST", hint=f"e.g. {_EXAMPLE}")
    ref = Reference(m["registry"], m["repository"], m["tag"], m["digest"])
    if need_tag and not ref.tag:
        raise InputError(f"{text!r} names no tag; a bundle is pushed under a tag "
                         "(REGISTRY/REPO:TAG)")
    if not ref.tag and not ref.digest:
        raise InputError(f"{text!r} names no tag and no digest", hint=f"e.g. {_EXAMPLE}")
    return ref


def looks_like_reference(text: str) -> bool:
    """Whether ``text`` parses as a registry reference (a local path may too: callers look at
    the file system first)."""
    try:
        parse_reference(text)
    except InputError:
        return False
    return True


def _is_registry(host: str) -> bool:
    """docker's rule: the first component is a registry when it has a dot or a port, or is
    localhost."""
    return "." in host or ":" in host or host == "localhost"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (no port) is this machine: ``localhost``, 127.0.0.0/8 or ::1. Names
    other than localhost are not resolved (a name can be made to resolve anywhere)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["DIGEST", "Reference", "is_loopback", "looks_like_reference", "parse_reference"]
