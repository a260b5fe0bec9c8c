"""Who is calling: bearer tokens (JWT or API key) -> a :class:`Principal` with its tenant.

* JWT, HS256 with a shared secret (``--jwt-secret-file``) or RS256 with the public
  keys of a JWKS file (``--jwks-file``, the key picked by the token's ``kid``);
  ``exp`` is required, ``iss``/``aud`` checked when configured, the tenant read from
  ``--tenant-claim`` (default ``tenant``).
  A JWKS file holding a private key (a ``d`` member) or a symmetric (``oct``) key is
  refused, naming the key's kid (:func:`jwks_problem`): it is a leaked signing key.
* API keys: a file of ``<tenant> <key>`` lines; keys are kept only as SHA-256
  digests and compared in constant time.
* ``--open-access``: a request without a token is the anonymous principal (no
  tenant: it sees the raw session ids, as the CLI does). Never the default.
* Rotation: the files are looked at again at most every ``RECHECK_SECONDS``
  (:mod:`harness.services.mounted`) and read again when they changed, so a rotated
  Kubernetes Secret (a new JWKS key, a revoked API key) needs no restart. A change that
  cannot be used is logged and the previous keys stay.

A token is never logged, never put in an error message, never a metric label.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, MissingExtra
from harness.services.gateway.settings import (
    GatewaySettings,
    inapplicable_auth_settings,
    inapplicable_message,
)
from harness.services.mounted import RECHECK_SECONDS, Recheck

__all__ = ["AuthError", "Authenticator", "GatewayConfigError", "Principal"]


class GatewayConfigError(HarnessError):
    """The gateway's auth settings are unusable (missing file, bad JWKS ...)."""


class AuthError(HarnessError):
    """A request's credentials are missing or invalid (HTTP 401)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: its tenant (None = anonymous under ``--open-access``) and how it proved it."""

    tenant: str | None
    method: str  # jwt | api_key | anonymous


ANONYMOUS = Principal(tenant=None, method="anonymous")

log = logging.getLogger("harness.gateway")


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GatewayConfigError(f"cannot read the {what} {path!r}: {exc.strerror}; check the path") from exc


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


MAX_TENANT = 256
"""The longest tenant name taken (it is part of every log key of the tenant's sessions)."""


def tenant_problem(tenant: str) -> str | None:
    """Why ``tenant`` cannot name a tenant (None: it can): 1 to ``MAX_TENANT`` characters of
    text, no control character, encodable as UTF-8 (a JSON string may hold a lone surrogate)."""
    if not tenant:
        return "it is empty"
    if len(tenant) > MAX_TENANT:
        return f"it is longer than {MAX_TENANT} characters"
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in tenant):
        return "it holds a control character"
    try:
        tenant.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode text (a lone surrogate)"
    return None


def load_api_keys(path: str) -> dict[bytes, str]:
    """``<tenant> <key>`` lines -> {sha256(key): tenant}.

    Raises:
        GatewayConfigError: a line that is not two words, a tenant that cannot be one, or
            one key given to two tenants (its callers would silently act as the last one).
            The message names the line, never the key.
    """
    keys: dict[bytes, str] = {}
    lines = _read(path, "API keys file").removeprefix("\ufeff").splitlines()  # (a BOM is no part of a tenant)
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise GatewayConfigError(f"{path}:{number}: expected '<tenant> <key>' (two words)")
        tenant, key = parts
        problem = tenant_problem(tenant)
        if problem is not None:
            raise GatewayConfigError(f"{path}:{number}: the tenant cannot name a tenant: {problem}")
        digest = _digest(key)
        if keys.get(digest, tenant) != tenant:
            raise GatewayConfigError(f"{path}:{number}: this key is given to tenant {keys[digest]!r} too: "
                                     "each key names one tenant")
        keys[digest] = tenant
    if not keys:
        raise GatewayConfigError(f"{path} holds no API key: add lines '<tenant> <key>'")
    return keys


@dataclass(frozen=True, slots=True)
class _Keys:
    """What the auth files hold."""

    api_keys: dict[bytes, str] = field(default_factory=dict)  # sha256(key) -> tenant
    hs_secret: str | None = None
    rs_keys: dict[str | None, Any] = field(default_factory=dict)  # kid -> public key


def _load_keys(settings: GatewaySettings) -> _Keys:
    api_keys = load_api_keys(settings.api_keys_file) if settings.api_keys_file else {}
    hs_secret: str | None = None
    rs_keys: dict[str | None, Any] = {}
    if settings.jwt_secret_file or settings.jwks_file:
        try:
            import jwt
        except ImportError as exc:
            raise MissingExtra("JWT authentication in the gateway", "gateway") from exc
        if settings.jwt_secret_file:
            hs_secret = _read(settings.jwt_secret_file, "JWT secret file").strip()
            if not hs_secret:
                raise GatewayConfigError(f"the JWT secret file {settings.jwt_secret_file!r} is empty")
        if settings.jwks_file:
            rs_keys = _load_jwks(settings.jwks_file, jwt)
    return _Keys(api_keys=api_keys, hs_secret=hs_secret, rs_keys=rs_keys)


class Authenticator:
    """Turns an ``Authorization`` header into a :class:`Principal` (or raises :class:`AuthError`).

    Args:
        settings: which files hold the keys, the claims to check.
        recheck: least seconds between two looks at the files.
        clock: monotonic seconds (tests pass their own).

    Raises:
        GatewayConfigError: a file is missing or unusable, no authentication at all, or a
            setting the auth mode does nothing with (``jwt_issuer`` without a JWT key ...:
            :func:`~harness.services.gateway.settings.inapplicable_auth_settings`).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        recheck: float = RECHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        ignored = inapplicable_auth_settings(settings)
        if ignored:  # (a setting the mode does nothing with is a mistake to say, not to ignore)
            raise GatewayConfigError(inapplicable_message(ignored[0], settings))
        self.open_access = settings.open_access
        self.tenant_claim = settings.tenant_claim
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self._settings = settings
        files = [f for f in (settings.api_keys_file, settings.jwt_secret_file, settings.jwks_file) if f]
        self._recheck = Recheck(files, every=recheck, clock=clock)
        self._keys = _load_keys(settings)
        if not (self.open_access or self._keys.api_keys or self._keys.hs_secret or self._keys.rs_keys):
            raise GatewayConfigError(
                "no authentication configured: give a JWT secret, a JWKS file or an API keys file, "
                "or open_access=True (dev only)"
            )

    def _current(self) -> _Keys:
        """The keys now: the files read again first if it is time and they changed."""
        if self._recheck.changed():
            try:
                self._keys = _load_keys(self._settings)
            except GatewayConfigError as exc:
                log.warning("the gateway's auth files changed but cannot be used (%s); the previous keys stay", exc)
            else:
                log.info("the gateway's auth files changed: read again")
        return self._keys

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            if self.open_access:
                return ANONYMOUS
            raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("the Authorization header must be 'Bearer <token>'")
        keys = self._current()
        if keys.api_keys:
            digest = _digest(token)
            for known, tenant in keys.api_keys.items():
                if hmac.compare_digest(known, digest):
                    return Principal(tenant=tenant, method="api_key")
        jwt_on = bool(keys.hs_secret or keys.rs_keys)
        if jwt_on and (token.count(".") == 2 or not keys.api_keys):  # (a JWT is three dot-separated parts)
            return self._jwt(token, keys)
        raise AuthError("unknown API key, and not a JWT" if jwt_on else "unknown API key")

    def _jwt(self, token: str, keys: _Keys) -> Principal:
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        alg = header.get("alg")
        if alg == "HS256" and keys.hs_secret:
            key: Any = keys.hs_secret
        elif alg == "RS256" and keys.rs_keys:
            kid = header.get("kid")
            key = keys.rs_keys.get(kid) if kid is not None else None
            if key is None and len(keys.rs_keys) == 1 and kid is None:
                key = next(iter(keys.rs_keys.values()))
            if key is None:
                raise AuthError("invalid token: no key of the JWKS file has its kid")
        else:
            shown = repr(alg) if len(repr(alg)) <= 40 else repr(alg)[:40] + "..."
            raise AuthError(f"invalid token: algorithm {shown} is not accepted here")
        options: Any = {"require": ["exp"]} if self.audience else {"require": ["exp"], "verify_aud": False}
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=self.issuer, audience=self.audience,
                                options=options)
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        tenant = claims.get(self.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise AuthError(f"the token has no string claim {self.tenant_claim!r} naming its tenant")
        problem = tenant_problem(tenant)
        if problem is not None:
            raise AuthError(f"the token's claim {self.tenant_claim!r} cannot name a tenant: {problem}")
        return Principal(tenant=tenant, method="jwt")


PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth")
"""JWK members only a private key has (RSA: ``d`` and the CRT parts; EC and OKP: ``d``)."""


def _named(jwk: Any, at: int) -> str:
    """How a key of a JWKS is named in a message: its kid (shortened), else its place.
    Never any of its material."""
    kid = jwk.get("kid") if isinstance(jwk, dict) else None
    if isinstance(kid, str) and kid:
        return f"kid {kid[:64]!r}" + ("..." if len(kid) > 64 else "")
    return f"key #{at + 1} (no kid)"


def jwks_problem(keys: Any) -> str | None:
    """Why a JWKS's keys cannot be a file of public keys (None: they can).

    A private key (a ``d`` member ...) in it is a signing key that left its owner: whoever
    reads the file can mint tokens. A symmetric (``oct``) key is a shared secret. Either is
    refused, naming the key by its kid; the message never holds key material.
    """
    if not isinstance(keys, list):
        return None
    for at, jwk in enumerate(keys):
        if not isinstance(jwk, dict):
            continue
        if jwk.get("kty") == "oct":
            return (f"{_named(jwk, at)} is a symmetric (oct) key, a shared secret: a JWKS file holds public keys "
                    "only; remove it (for HS256 give the secret with --jwt-secret-file)")
        if any(member in jwk for member in PRIVATE_MEMBERS):
            return (f"{_named(jwk, at)} is a PRIVATE key: a JWKS file holds public keys only, and a private key "
                    "here is a leaked signing key; rotate it and publish only its public part")
    return None


def _load_jwks(path: str, jwt: Any) -> dict[str | None, Any]:
    try:
        data = json.loads(_read(path, "JWKS file"))
        keys = data["keys"] if isinstance(data, dict) and "keys" in data else [data]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise GatewayConfigError(f"the JWKS file {path!r} is not a JSON Web Key Set: {exc}") from exc
    problem = jwks_problem(keys)
    if problem is not None:  # (before any key is parsed: a library's error could quote it)
        raise GatewayConfigError(f"the JWKS file {path!r}: {problem}")
    try:
        out: dict[str | None, Any] = {}
        for jwk in keys:
            if jwk.get("kty") != "RSA" or jwk.get("use", "sig") != "sig":
                continue
            out[jwk.get("kid")] = jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(jwk))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise GatewayConfigError(f"the JWKS file {path!r} is not a JSON Web Key Set: {exc}") from exc
    if not out:
        raise GatewayConfigError(f"the JWKS file {path!r} has no RSA signing key")
    return out
