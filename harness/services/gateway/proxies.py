"""Which address a request comes from: the peer, or what a trusted proxy says (pure: no I/O).

Behind an ingress or a load balancer every request's peer is the proxy, so the per-address
limits (``--auth-failure-limit``, ``--rate-limit`` under ``--open-access``) would put every
caller in one bucket. The proxy names the caller in ``X-Forwarded-For``; anybody can send
that header too, so it is believed only from the peers of ``--forwarded-allow-ips``
(``HARNESS_GATEWAY_FORWARDED_ALLOW_IPS``): addresses and networks (``10.0.0.0/8``), or ``*``
(any peer: only where nothing but the proxy can reach the gateway). Default: the loopback
addresses, as uvicorn's own default (a proxy on the same machine).

The client is the rightmost address of the header that is not a trusted proxy (the ones
left of it were written by the caller, who may have made them up); if every one is
trusted, the leftmost. An entry that is not an IP address leaves the peer as the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["ANY_PROXY", "DEFAULT_FORWARDED_ALLOW_IPS", "TrustedProxies", "parse_forwarded_allow_ips"]

ANY_PROXY = "*"
DEFAULT_FORWARDED_ALLOW_IPS: tuple[str, ...] = ("127.0.0.1", "::1")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_forwarded_allow_ips(text: str) -> tuple[str, ...]:
    """``10.0.0.0/8,192.168.1.7`` -> the entries, normalised.

    Raises:
        ValueError: an entry that is no IP address nor network, or none at all; the
            message names it and says what to give.
    """
    out: list[str] = []
    for part in text.split(","):
        raw = part.strip()
        if not raw:
            continue
        if raw == ANY_PROXY:
            out.append(ANY_PROXY)
            continue
        try:
            out.append(str(ipaddress.ip_network(raw.strip("[]"), strict=False)) if "/" in raw
                       else str(ipaddress.ip_address(raw.strip("[]"))))
        except ValueError:
            raise ValueError(f"{raw[:100]!r} is not an IP address or network (e.g. 10.0.0.7, 10.0.0.0/8, "
                             "fd00::/8; '*' for any peer)") from None
    if not out:
        raise ValueError("no address given: give the proxies' IP addresses or networks separated by commas")
    return tuple(dict.fromkeys(out))


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An ``X-Forwarded-For`` entry's address (a port and IPv6 brackets dropped), or None."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # IPv4 with a port
        text = text.partition(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class TrustedProxies:
    """The peers whose ``X-Forwarded-For`` is believed (entries of :func:`parse_forwarded_allow_ips`)."""

    def __init__(self, entries: Iterable[str]) -> None:
        entries = tuple(entries)
        self.any = ANY_PROXY in entries
        self._networks: list[Network] = [ipaddress.ip_network(e, strict=False) for e in entries if e != ANY_PROXY]

    def trusts(self, host: str | None) -> bool:
        if host is None:
            return False
        if self.any:
            return True
        ip = _ip(host)
        return ip is not None and any(ip.version == n.version and ip in n for n in self._networks)

    def client(self, peer: str | None, forwarded_for: Iterable[str]) -> str | None:
        """The caller's address: ``peer`` unless it is trusted and ``forwarded_for`` (the
        header's values, in order) names another."""
        if not self.trusts(peer):
            return peer
        chain = [entry for value in forwarded_for for entry in value.split(",") if entry.strip()]
        if not chain:
            return peer
        for entry in reversed(chain):
            ip = _ip(entry)
            if ip is None:
                return peer
            if not self.trusts(str(ip)):
                return str(ip)
        first = _ip(chain[0])
        return str(first) if first is not None else peer
