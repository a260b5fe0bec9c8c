"""Who is calling: bearer tokens (JWT or API key) -> a :class:`Principal` with its tenant.

* JWT, HS256 with a shared secret (``--jwt-secret-file``) or RS256 with the public
  keys of a JWKS file (``--jwks-file``, the key picked by the token's ``kid``);
  ``exp`` is required, ``iss``/``aud`` checked when configured, the tenant read from
  ``--tenant-claim`` (default ``tenant``).
* API keys: a file of ``<tenant> <key>`` lines; keys are kept only as SHA-256
  digests and compared in constant time.
* ``--open-access``: a request without a token is the anonymous principal (no
  tenant: it sees the raw session ids, as the CLI does). Never the default.

A token is never logged, never put in an error message, never a metric label.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, MissingExtra
from harness.services.gateway.settings import GatewaySettings

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


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GatewayConfigError(f"cannot read the {what} {path!r}: {exc.strerror}; check the path") from exc


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def load_api_keys(path: str) -> dict[bytes, str]:
    """``<tenant> <key>`` lines -> {sha256(key): tenant}."""
    keys: dict[bytes, str] = {}
    for number, line in enumerate(_read(path, "API keys file").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise GatewayConfigError(f"{path}:{number}: expected '<tenant> <key>' (two words)")
        tenant, key = parts
        keys[_digest(key)] = tenant
    if not keys:
        raise GatewayConfigError(f"{path} holds no API key: add lines '<tenant> <key>'")
    return keys


class Authenticator:
    """Turns an ``Authorization`` header into a :class:`Principal` (or raises :class:`AuthError`)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.open_access = settings.open_access
        self.tenant_claim = settings.tenant_claim
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self._api_keys = load_api_keys(settings.api_keys_file) if settings.api_keys_file else {}
        self._hs_secret: str | None = None
        self._rs_keys: dict[str | None, Any] = {}
        if settings.jwt_secret_file or settings.jwks_file:
            try:
                import jwt
            except ImportError as exc:
                raise MissingExtra("JWT authentication in the gateway", "gateway") from exc
            if settings.jwt_secret_file:
                self._hs_secret = _read(settings.jwt_secret_file, "JWT secret file").strip()
                if not self._hs_secret:
                    raise GatewayConfigError(f"the JWT secret file {settings.jwt_secret_file!r} is empty")
            if settings.jwks_file:
                self._rs_keys = _load_jwks(settings.jwks_file, jwt)
        if not (self.open_access or self._api_keys or self._hs_secret or self._rs_keys):
            raise GatewayConfigError(
                "no authentication configured: give a JWT secret, a JWKS file or an API keys file, "
                "or open_access=True (dev only)"
            )

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            if self.open_access:
                return ANONYMOUS
            raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("the Authorization header must be 'Bearer <token>'")
        if self._api_keys:
            digest = _digest(token)
            for known, tenant in self._api_keys.items():
                if hmac.compare_digest(known, digest):
                    return Principal(tenant=tenant, method="api_key")
        if self._hs_secret or self._rs_keys:
            return self._jwt(token)
        raise AuthError("unknown API key")

    def _jwt(self, token: str) -> Principal:
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        alg = header.get("alg")
        if alg == "HS256" and self._hs_secret:
            key: Any = self._hs_secret
        elif alg == "RS256" and self._rs_keys:
            kid = header.get("kid")
            key = self._rs_keys.get(kid) if kid is not None else None
            if key is None and len(self._rs_keys) == 1 and kid is None:
                key = next(iter(self._rs_keys.values()))
            if key is None:
                raise AuthError("invalid token: no key of the JWKS file has its kid")
        else:
            raise AuthError(f"invalid token: algorithm {alg!r} is not accepted here")
        options: Any = {"require": ["exp"]} if self.audience else {"require": ["exp"], "verify_aud": False}
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=self.issuer, audience=self.audience,
                                options=options)
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        tenant = claims.get(self.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise AuthError(f"the token has no string claim {self.tenant_claim!r} naming its tenant")
        return Principal(tenant=tenant, method="jwt")


def _load_jwks(path: str, jwt: Any) -> dict[str | None, Any]:
    try:
        data = json.loads(_read(path, "JWKS file"))
        keys = data["keys"] if isinstance(data, dict) and "keys" in data else [data]
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
