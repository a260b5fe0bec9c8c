"""Which ``Host`` headers the gateway answers (pure: no I/O).

A gateway bound to a loopback address is reachable by the browser of the machine it runs
on, and so by any web page through DNS rebinding: the page's own name is made to resolve
to 127.0.0.1, and the browser, believing it talks to the page's origin, sends
``Host: evil.example`` with a request the same-origin policy lets the page read. Under
``--open-access`` that is the whole API. Answering only the names the gateway is meant
to be reached by ends it: ``--allowed-hosts`` (``HARNESS_GATEWAY_ALLOWED_HOSTS``).

* Patterns are host names or IP addresses, any port: ``localhost``, ``10.1.2.3``,
  ``[::1]`` (or ``::1``); ``*.example.com`` (any name under it, not ``example.com``
  itself); ``*`` (any host). Case and a trailing dot do not matter.
* Default (:func:`allowed_hosts`): bound to a loopback address, the loopback names
  (``localhost``, ``127.0.0.1``, ``::1``) and the bound address; bound to any other
  address (``0.0.0.0`` in a container, behind an ingress whose Host varies), any host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["ANY_HOST", "LOOPBACK_NAMES", "allowed_hosts", "host_allowed", "host_name", "parse_allowed_hosts"]

ANY_HOST = "*"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _normal(name: str) -> str:
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name


def parse_allowed_hosts(text: str) -> tuple[str, ...]:
    """``host1,host2`` -> the patterns, normalised.

    Raises:
        ValueError: an empty list, a pattern with a port, or a ``*`` that is not
            ``*`` alone or a leading ``*.``; the message says what to give instead.
    """
    patterns: list[str] = []
    for part in text.split(","):
        raw = part.strip()
        if not raw:
            continue
        if "://" in raw:  # a URL: its host is what the Host header carries
            host = raw.split("://", 1)[1].split("/", 1)[0]
            raise ValueError(f"{raw!r} is a URL: give the host alone ({host_name(host) or 'localhost'!r}, any port)")
        pattern = _normal(part)
        bracketed = raw.startswith("[")
        if bracketed and "]" not in raw:
            raise ValueError(f"{raw!r} is not a host name or an IP address (an IPv6 address goes in [ ])")
        if (bracketed and not raw.rstrip(".").endswith("]")) or (not bracketed and pattern.count(":") == 1):
            raise ValueError(f"{raw!r} has a port: give the host alone (any port is allowed)")
        if "*" in raw and not (raw == ANY_HOST or (pattern.startswith("*.") and "*" not in pattern[2:])):
            # ('*.' would read as '*' once its trailing dot is dropped: any host, not what was meant)
            raise ValueError(f"{raw!r}: a '*' is only allowed as '*' (any host) or '*.example.com'")
        if not pattern or "/" in pattern or " " in pattern:
            raise ValueError(f"{part.strip()!r} is not a host name or an IP address")
        patterns.append(pattern)
    if not patterns:
        raise ValueError("no host given: give host names separated by commas, or '*' for any host")
    return tuple(dict.fromkeys(patterns))


def _is_loopback(host: str) -> bool:
    name = _normal(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(given: tuple[str, ...] | None, bind_host: str) -> tuple[str, ...] | None:
    """The patterns the gateway answers (None: any host).

    Args:
        given: ``--allowed-hosts`` (None when not given).
        bind_host: the address it listens on (``--host``).
    """
    if given is not None:
        return None if ANY_HOST in given else given
    if _is_loopback(bind_host):
        return tuple(dict.fromkeys((*LOOPBACK_NAMES, _normal(bind_host))))
    return None


def host_name(header: str) -> str:
    """A ``Host`` header's host, without its port, normalised (``[::1]:8080`` -> ``::1``)."""
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        return _normal(header[1:end] if end > 0 else header[1:])
    if header.count(":") == 1:  # (more than one: an IPv6 address sent without brackets)
        header = header.partition(":")[0]
    return _normal(header)


def host_allowed(header: str | None, patterns: Iterable[str]) -> bool:
    """Whether a request with this ``Host`` header (None: none sent) is answered."""
    if header is None:
        return False
    name = host_name(header)
    if not name:
        return False
    for pattern in patterns:
        if pattern in (ANY_HOST, name):
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
            return True
    return False
