"""The gateway's settings: one frozen object, from the command line or the environment.

The environment is read once, by :func:`parse_settings`; the rest of the gateway
only sees :class:`GatewaySettings`. Every flag has an environment variable of the
same name (``--jwt-issuer`` -> ``HARNESS_JWT_ISSUER``), as the Helm chart sets them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from harness.cli.common import MAX_SECONDS, MAX_WHOLE, CommandParser, kafka_client_config, seconds_or_zero
from harness.runtime.worker import DEFAULT_DRAIN_TIMEOUT
from harness.services.gateway.authlimit import DEFAULT_AUTH_FAILURE_LIMIT
from harness.services.gateway.breaker import DEFAULT_READ_TIMEOUT_S
from harness.services.gateway.hosts import parse_allowed_hosts
from harness.services.gateway.proxies import DEFAULT_FORWARDED_ALLOW_IPS, parse_forwarded_allow_ips
from harness.services.mounted import RECHECK_SECONDS

__all__ = [
    "GatewaySettings",
    "add_gateway_arguments",
    "auth_mode",
    "inapplicable_auth_settings",
    "inapplicable_message",
    "parse_settings",
    "settings_from_args",
]

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_HEARTBEAT_S = 15.0
DEFAULT_MAX_STREAMS_PER_TENANT = 1000
DEFAULT_MAX_WAITS_PER_TENANT = 1000
DEFAULT_SESSION_CACHE_MB = 64
"""The records of recently read sessions kept in memory, in MB of their log size (a few
times that in the process: fits the chart's 512Mi gateway limit)."""
DEFAULT_TENANT_CLAIM = "tenant"
DEFAULT_RATE_LIMIT = 0.0
"""Off: a tenant may be one person or a whole company's app, so no one rate fits every
deployment, and a limit switched on by an upgrade would refuse working clients. The
operator who knows its tenants sets one (the runbook suggests how)."""


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Everything the gateway needs to know at start.

    Args:
        log: the session log URL (``sqlite:///harness.db``, ``kafka://...``).
        apps: ``module:attribute`` harnesses loaded to know names and ask schemas
            (the gateway never drives a turn with them).
        open_access: serve without authentication (dev only; must be asked for).
        jwt_secret_file: a file holding the HS256 secret.
        jwks_file: a JSON Web Key Set file with the RS256 public keys.
        jwt_issuer / jwt_audience: checked when given.
        tenant_claim: the JWT claim naming the tenant.
        api_keys_file: lines ``<tenant> <key>`` (``#`` comments).
        secrets_recheck_s: least seconds between two looks at the auth files (read again
            when they change: a rotated Secret needs no restart).
        max_body_bytes: request bodies larger than this get 413.
        heartbeat_s: seconds between SSE heartbeat comments on an idle stream.
        max_streams_per_tenant: event streams (``GET .../events``) one tenant may hold open
            at once in this process; one more is a 429 (the anonymous caller of
            ``open_access`` is one tenant).
        max_waits_per_tenant: message and answer POSTs with ``?wait=`` one tenant may have
            waiting at once in this process; one more is a 429.
        session_cache_mb: the recently read sessions' records kept in memory, in MB of their
            size in the log (``sessions.Sessions``; a few times that in the process).
        allowed_hosts: the ``Host`` names answered (``hosts.parse_allowed_hosts`` patterns);
            None: the loopback names when bound to a loopback address, else any
            (``hosts.allowed_hosts``). Another Host gets 400 (DNS rebinding).
        rate_limit: write requests (POST, PUT, PATCH, DELETE) a second one tenant (or, under
            ``open_access`` without a token, one client address) may send on average, with
            bursts of twice as many; more get 429 with ``Retry-After``. 0: no limit.
        rate_limit_reads: the rate limit counts every API request, reads too.
        auth_failure_limit: failed authentications one client address may have at once and a
            minute (``authlimit.AuthFailureLimit``); past it, a request with credentials from
            it gets 429 with ``Retry-After`` before they are checked. 0: no limit.
        forwarded_allow_ips: the peers (IP addresses, networks, or ``*``) whose
            ``X-Forwarded-For`` names the client address (``proxies.TrustedProxies``);
            default the loopback addresses. Behind an ingress: its addresses, or every
            caller shares the ingress's address in the per-address limits.
        read_timeout_s: a read of the log that takes longer makes the gateway ask the log
            whether it answers; if not, it gets 503, and so do the next requests, at once,
            until the log answers again (``breaker.LogBreaker``).
        kafka_config: librdkafka settings for every Kafka client (security, SASL ...),
            from ``HARNESS_KAFKA_CONFIG_<KEY>`` as the worker reads them.
        secrets_dir: (``harness serve``'s worker) one file per secret for the sessions'
            tools, as ``harness worker --secrets-dir``; ``HARNESS_SECRET_<NAME>`` adds more.
        max_sessions: (``harness serve``'s worker) at most this many sessions at once.
        drain_timeout_s: (``harness serve``'s worker) how long a stop lets running tool
            and model calls finish (``Worker(drain_timeout=)``).
    """

    log: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    metrics_port: int | None = None
    apps: tuple[str, ...] = ()
    open_access: bool = False
    jwt_secret_file: str | None = None
    jwks_file: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    tenant_claim: str = DEFAULT_TENANT_CLAIM
    api_keys_file: str | None = None
    secrets_recheck_s: float = RECHECK_SECONDS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    max_streams_per_tenant: int = DEFAULT_MAX_STREAMS_PER_TENANT
    max_waits_per_tenant: int = DEFAULT_MAX_WAITS_PER_TENANT
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    session_cache_mb: int = DEFAULT_SESSION_CACHE_MB
    allowed_hosts: tuple[str, ...] | None = None
    rate_limit: float = DEFAULT_RATE_LIMIT
    rate_limit_reads: bool = False
    auth_failure_limit: int = DEFAULT_AUTH_FAILURE_LIMIT
    forwarded_allow_ips: tuple[str, ...] = DEFAULT_FORWARDED_ALLOW_IPS
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    secrets_dir: str | None = None
    max_sessions: int | None = None
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT.total_seconds()
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_auth(self) -> bool:
        return bool(self.jwt_secret_file or self.jwks_file or self.api_keys_file)

    @property
    def has_jwt(self) -> bool:
        return bool(self.jwt_secret_file or self.jwks_file)


OPTIONS = {"jwt_secret_file": "--jwt-secret-file", "jwks_file": "--jwks-file", "api_keys_file": "--api-keys-file",
           "open_access": "--open-access", "jwt_issuer": "--jwt-issuer", "jwt_audience": "--jwt-audience",
           "tenant_claim": "--tenant-claim", "secrets_recheck_s": "--secrets-recheck", "secrets_dir": "--secrets-dir"}
"""The flag of each auth setting (and ``harness serve``'s ``secrets_dir``), as messages name them."""


_DEFAULTS: dict[str, object] = {"jwt_issuer": None, "jwt_audience": None, "tenant_claim": DEFAULT_TENANT_CLAIM,
                                "secrets_recheck_s": RECHECK_SECONDS}
"""The auth settings a mode may ignore, at their defaults."""


def _named(field: str, cli: bool) -> str:
    return OPTIONS[field] if cli else field


def auth_mode(settings: GatewaySettings, *, cli: bool = False) -> str:
    """The auth mode ``settings`` choose, as a message names it: what it is and, in brackets,
    the settings that choose it (their flags with ``cli``, else their field names)."""
    if settings.has_jwt:
        files = [_named(f, cli) for f in ("jwt_secret_file", "jwks_file") if getattr(settings, f)]
        return f"JWT authentication ({', '.join(files)})"
    if settings.api_keys_file:
        chosen = [_named("api_keys_file", cli)] + ([_named("open_access", cli)] if settings.open_access else [])
        return f"API-key authentication ({', '.join(chosen)})"
    return f"open access ({_named('open_access', cli)}, no auth file)"


def inapplicable_auth_settings(settings: GatewaySettings, given: Collection[str] = ()) -> list[str]:
    """The fields of ``settings`` that have no effect in its auth mode (empty: all apply);
    a field at its default value is named only if it is in ``given`` (the fields the user
    set: ``--tenant-claim tenant`` is as ignored as ``--tenant-claim org``).

    * ``jwt_issuer``, ``jwt_audience``, ``tenant_claim``: checked in JWTs only, so they need
      ``jwt_secret_file`` or ``jwks_file`` (API keys and open access have no claims);
    * ``secrets_recheck_s``: how often the auth files (and ``harness serve``'s
      ``secrets_dir``) are looked at, so it needs one of them.

    ``open_access`` with auth files is a mode of its own (a request without a token is the
    anonymous caller; one with a token is checked), never named here.
    """
    def set_(name: str) -> bool:
        return name in given or getattr(settings, name) != _DEFAULTS[name]

    out: list[str] = []
    if not settings.has_jwt:
        out += [name for name in ("jwt_issuer", "jwt_audience", "tenant_claim") if set_(name)]
    if set_("secrets_recheck_s") and not settings.has_auth and not settings.secrets_dir:
        out.append("secrets_recheck_s")
    return out


def inapplicable_message(field: str, settings: GatewaySettings, *, cli: bool = False, shown: str | None = None) -> str:
    """One line: setting ``field`` does not apply to the auth mode of ``settings``, and what
    to do. Names are flags with ``cli``, else field names; ``shown`` names the setting
    itself otherwise (an environment variable)."""
    name = shown or _named(field, cli)
    mode = auth_mode(settings, cli=cli)
    if field == "secrets_recheck_s":
        return (f"{name} does not apply to {mode}: it is how often the auth files (and harness serve's "
                f"{_named('secrets_dir', cli)}) are looked at, and there is none; drop it")
    return (f"{name} does not apply to {mode}: only JWTs are checked against it; give "
            f"{_named('jwt_secret_file', cli)} or {_named('jwks_file', cli)} to accept JWTs, or drop {name}")


T = TypeVar("T")


def _whole(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, not {text!r}") from None
    if value > MAX_WHOLE:  # (larger ones overflowed the C code under the server)
        raise argparse.ArgumentTypeError(f"{what}, at most {MAX_WHOLE}, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = _whole(text, "must be a positive integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _port(text: str) -> int:
    value = _whole(text, "a port is a whole number 0..65535")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, not {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}") from None
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be a positive number, at most {MAX_SECONDS:.0f}, not {text}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be requests per second (0: no limit), not {text!r}") from None
    if not 0 <= value <= MAX_WHOLE:
        raise argparse.ArgumentTypeError(f"must be requests per second, 0 to {MAX_WHOLE} (0: no limit), not {text}")
    return value


def _failures(text: str) -> int:
    what = "must be failed authentications a minute per client address, a whole number 0 or more (0: no limit)"
    value = _whole(text, what)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{what}, not {text}")
    return value


def _proxies(text: str) -> tuple[str, ...]:
    try:
        return parse_forwarded_allow_ips(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _hosts(text: str) -> tuple[str, ...]:
    try:
        return parse_allowed_hosts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _from_env(env: Mapping[str, str], name: str, convert: Callable[[str], T], default: T) -> T:
    """``env[name]`` converted, or ``default``; a bad value names its variable."""
    text = env.get(name)
    if not text:  # unset or empty: the default
        return default
    try:
        return convert(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    """A switch set through the environment: true or false; another word is refused (it
    was read as false, so HARNESS_OPEN_ACCESS=on stopped the start saying no auth was set,
    and HARNESS_GATEWAY_RATE_LIMIT_READS=on left reads unlimited without a word)."""
    text = env.get(name, "").strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise argparse.ArgumentTypeError(f"{name} takes true or false (1 or 0, yes or no, on or off), not {env[name]!r}")


def add_gateway_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str], *, with_auth: bool = True) -> None:
    """The gateway's flags, defaults from ``env`` (shared by ``harness gateway`` and ``harness serve``)."""
    get = env.get
    parser.add_argument("--log", default=get("HARNESS_LOG"), help="session log URL (HARNESS_LOG)")
    parser.add_argument("--host", default=get("HARNESS_GATEWAY_HOST", "127.0.0.1"),
                        help="address to listen on (HARNESS_GATEWAY_HOST; default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=_from_env(env, "HARNESS_GATEWAY_PORT", _port, DEFAULT_PORT),
                        help=f"HTTP port (HARNESS_GATEWAY_PORT; default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--metrics-port", type=_port, default=_from_env(env, "HARNESS_METRICS_PORT", _port, None),
                        help="serve /metrics on this port (HARNESS_METRICS_PORT)")
    parser.add_argument("--app", action="append", default=None,
                        help="module:attribute of a harness (repeat; HARNESS_APPS, comma-separated)")
    parser.add_argument("--max-body-bytes", type=_positive_int,
                        default=_from_env(env, "HARNESS_GATEWAY_MAX_BODY_BYTES", _positive_int, DEFAULT_MAX_BODY_BYTES),
                        help="larger request bodies get 413 (HARNESS_GATEWAY_MAX_BODY_BYTES)")
    parser.add_argument("--heartbeat", type=_positive_float,
                        default=_from_env(env, "HARNESS_GATEWAY_HEARTBEAT_SECONDS", _positive_float, DEFAULT_HEARTBEAT_S),
                        help="seconds between SSE heartbeats (HARNESS_GATEWAY_HEARTBEAT_SECONDS)")
    parser.add_argument("--max-streams-per-tenant", type=_positive_int, metavar="N",
                        default=_from_env(env, "HARNESS_GATEWAY_MAX_STREAMS_PER_TENANT", _positive_int,
                                          DEFAULT_MAX_STREAMS_PER_TENANT),
                        help="event streams one tenant may hold open at once; more get 429 "
                        f"(HARNESS_GATEWAY_MAX_STREAMS_PER_TENANT; default {DEFAULT_MAX_STREAMS_PER_TENANT})")
    parser.add_argument("--max-waits-per-tenant", type=_positive_int, metavar="N",
                        default=_from_env(env, "HARNESS_GATEWAY_MAX_WAITS_PER_TENANT", _positive_int,
                                          DEFAULT_MAX_WAITS_PER_TENANT),
                        help="POSTs with ?wait= one tenant may have waiting at once; more get 429 "
                        f"(HARNESS_GATEWAY_MAX_WAITS_PER_TENANT; default {DEFAULT_MAX_WAITS_PER_TENANT})")
    parser.add_argument("--session-cache-mb", type=_positive_int, metavar="MB",
                        default=_from_env(env, "HARNESS_GATEWAY_SESSION_CACHE_MB", _positive_int,
                                          DEFAULT_SESSION_CACHE_MB),
                        help="recently read sessions kept in memory, in MB of their records' size in the log (a few "
                        "times that in the process: keep it well under the memory limit) "
                        f"(HARNESS_GATEWAY_SESSION_CACHE_MB; default {DEFAULT_SESSION_CACHE_MB})")
    parser.add_argument("--read-timeout", type=_positive_float, metavar="SECONDS",
                        default=_from_env(env, "HARNESS_GATEWAY_READ_TIMEOUT_SECONDS", _positive_float,
                                          DEFAULT_READ_TIMEOUT_S),
                        help="a read of the log taking longer makes the gateway ask the log whether it answers: if "
                        "not, it and the next requests answer 503 until it does (HARNESS_GATEWAY_READ_TIMEOUT_SECONDS; "
                        f"default {DEFAULT_READ_TIMEOUT_S:g})")
    parser.add_argument("--allowed-hosts", type=_hosts, metavar="HOST,HOST",
                        default=_from_env(env, "HARNESS_GATEWAY_ALLOWED_HOSTS", _hosts, None),
                        help="answer only requests whose Host header names one of these (any port; '*.example.com' "
                        "for the names under it; '*' for any); others get 400, which stops DNS rebinding "
                        "(HARNESS_GATEWAY_ALLOWED_HOSTS; default: localhost, 127.0.0.1 and ::1 when --host is a "
                        "loopback address, any host otherwise)")
    parser.add_argument("--rate-limit", type=_rate, metavar="N",
                        default=_from_env(env, "HARNESS_GATEWAY_RATE_LIMIT", _rate, DEFAULT_RATE_LIMIT),
                        help="write requests (POST, PUT, PATCH, DELETE) a second one tenant may send on average, in "
                        "bursts of 2N; more get 429 with Retry-After; per client address under --open-access "
                        f"(HARNESS_GATEWAY_RATE_LIMIT; default {DEFAULT_RATE_LIMIT:g}: no limit)")
    parser.add_argument("--rate-limit-reads", action="store_true",
                        default=_env_flag(env, "HARNESS_GATEWAY_RATE_LIMIT_READS"),
                        help="--rate-limit counts every API request, reads too (HARNESS_GATEWAY_RATE_LIMIT_READS=true)")
    parser.add_argument("--auth-failure-limit", type=_failures, metavar="N",
                        default=_from_env(env, "HARNESS_GATEWAY_AUTH_FAILURE_LIMIT", _failures,
                                          DEFAULT_AUTH_FAILURE_LIMIT),
                        help="failed authentications one client address may have at once and a minute; past it its "
                        "requests with credentials get 429 with Retry-After before they are checked "
                        f"(HARNESS_GATEWAY_AUTH_FAILURE_LIMIT; default {DEFAULT_AUTH_FAILURE_LIMIT}; 0: no limit)")
    parser.add_argument("--forwarded-allow-ips", type=_proxies, metavar="IP,NET",
                        default=_from_env(env, "HARNESS_GATEWAY_FORWARDED_ALLOW_IPS", _proxies,
                                          DEFAULT_FORWARDED_ALLOW_IPS),
                        help="peers whose X-Forwarded-For names the client address (IP addresses, networks like "
                        "10.0.0.0/8, '*' for any); behind an ingress name its addresses, or all callers share one "
                        "per-address limit (HARNESS_GATEWAY_FORWARDED_ALLOW_IPS; default 127.0.0.1,::1)")
    if not with_auth:
        return
    parser.add_argument("--jwt-secret-file", default=get("HARNESS_JWT_SECRET_FILE"),
                        help="HS256 secret for bearer JWTs (HARNESS_JWT_SECRET_FILE)")
    parser.add_argument("--jwks-file", default=get("HARNESS_JWKS_FILE"),
                        help="JWKS file with RS256 public keys; a private or symmetric key in it stops the start "
                        "(HARNESS_JWKS_FILE)")
    parser.add_argument("--jwt-issuer", default=get("HARNESS_JWT_ISSUER"), help="required iss of a JWT (JWT auth only; HARNESS_JWT_ISSUER)")
    parser.add_argument("--jwt-audience", default=get("HARNESS_JWT_AUDIENCE"),
                        help="required aud of a JWT (JWT auth only; HARNESS_JWT_AUDIENCE)")
    parser.add_argument("--tenant-claim", default=get("HARNESS_TENANT_CLAIM", "tenant"),
                        help="JWT claim naming the tenant (JWT auth only; HARNESS_TENANT_CLAIM; default 'tenant')")
    parser.add_argument("--api-keys-file", default=get("HARNESS_API_KEYS_FILE"),
                        help="file of '<tenant> <key>' lines (HARNESS_API_KEYS_FILE)")
    parser.add_argument("--secrets-recheck", type=_positive_float,
                        default=_from_env(env, "HARNESS_SECRETS_RECHECK_SECONDS", _positive_float, RECHECK_SECONDS),
                        help="least seconds between two looks at the auth files (and serve's --secrets-dir), read again "
                        f"when they change (HARNESS_SECRETS_RECHECK_SECONDS; default {RECHECK_SECONDS:g})")
    parser.add_argument("--open-access", action="store_true",
                        default=_env_flag(env, "HARNESS_OPEN_ACCESS"),
                        help="serve WITHOUT authentication (dev only; HARNESS_OPEN_ACCESS=true)")


def add_worker_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """The flags of ``harness serve``'s worker (as ``harness worker`` has them)."""
    parser.add_argument("--secrets-dir", default=env.get("HARNESS_SECRETS_DIR") or None, metavar="DIR",
                        help="one file per secret, given to every session's tools, read again when it changes "
                        "(HARNESS_SECRETS_DIR; HARNESS_SECRET_<NAME>=value adds one)")
    parser.add_argument("--max-sessions", type=_positive_int, metavar="N",
                        default=_from_env(env, "HARNESS_MAX_SESSIONS", _positive_int, None),
                        help="at most N sessions running at once; the others wait in order (HARNESS_MAX_SESSIONS)")
    parser.add_argument("--drain-timeout", type=seconds_or_zero, metavar="SECONDS",
                        default=_from_env(env, "HARNESS_DRAIN_TIMEOUT_SECONDS", seconds_or_zero,
                                          DEFAULT_DRAIN_TIMEOUT.total_seconds()),
                        help="on SIGTERM let running tool and model calls finish for at most this long before they "
                        f"are cut (HARNESS_DRAIN_TIMEOUT_SECONDS; default {DEFAULT_DRAIN_TIMEOUT.total_seconds():g}; "
                        "0: cut at once; a second signal ends the drain)")


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> GatewaySettings:
    apps = tuple(args.app) if args.app else tuple(a for a in env.get("HARNESS_APPS", "").split(",") if a)
    return GatewaySettings(
        log=args.log,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        apps=apps,
        open_access=bool(getattr(args, "open_access", True)),
        jwt_secret_file=getattr(args, "jwt_secret_file", None),
        jwks_file=getattr(args, "jwks_file", None),
        jwt_issuer=getattr(args, "jwt_issuer", None),
        jwt_audience=getattr(args, "jwt_audience", None),
        tenant_claim=getattr(args, "tenant_claim", "tenant"),
        api_keys_file=getattr(args, "api_keys_file", None),
        secrets_recheck_s=getattr(args, "secrets_recheck", RECHECK_SECONDS),
        max_body_bytes=args.max_body_bytes,
        heartbeat_s=args.heartbeat,
        max_streams_per_tenant=args.max_streams_per_tenant,
        max_waits_per_tenant=args.max_waits_per_tenant,
        read_timeout_s=args.read_timeout,
        session_cache_mb=args.session_cache_mb,
        allowed_hosts=args.allowed_hosts,
        rate_limit=args.rate_limit,
        rate_limit_reads=args.rate_limit_reads,
        auth_failure_limit=args.auth_failure_limit,
        forwarded_allow_ips=args.forwarded_allow_ips,
        kafka_config=kafka_client_config(env),
        secrets_dir=getattr(args, "secrets_dir", None),
        max_sessions=getattr(args, "max_sessions", None),
        drain_timeout_s=getattr(args, "drain_timeout", DEFAULT_DRAIN_TIMEOUT.total_seconds()),
    )


_EXAMPLES = {
    "harness gateway": "  harness gateway --log 'kafka://broker:9092?topic_prefix=acme' --port 8080 \\\n"
    "      --jwks-file /etc/harness/jwks.json --jwt-issuer https://auth.example.com --jwt-audience harness",
    "harness serve": "  harness serve --log sqlite:///harness.db --app myapp.agents:assistant --open-access",
}


def parse_settings(argv: Sequence[str] | None, env: Mapping[str, str], *, prog: str = "harness gateway",
                   description: str | None = None, worker: bool = False) -> GatewaySettings:
    """``harness gateway`` flags (and ``HARNESS_*`` environment) -> settings; usage errors exit 2.
    ``worker``: also the flags of the worker of ``harness serve``."""
    parser = CommandParser(prog=prog, description=description or "", example=_EXAMPLES.get(prog, ""))
    add_gateway_arguments(parser, env)
    if worker:
        add_worker_arguments(parser, env)
    args = parser.parse_args(argv)
    if not args.log:
        parser.error("--log is required (or HARNESS_LOG), e.g. --log sqlite:///harness.db")
    settings = settings_from_args(args, env)
    if not settings.has_auth and not settings.open_access:
        parser.error(
            "no authentication configured: give --jwt-secret-file, --jwks-file or --api-keys-file, "
            "or --open-access to serve without auth (dev only)"
        )
    if settings.jwt_secret_file and settings.jwks_file:
        parser.error("give --jwt-secret-file (HS256) or --jwks-file (RS256), not both")
    if settings.rate_limit_reads and not settings.rate_limit:
        parser.error("--rate-limit-reads needs --rate-limit N (requests per second)")
    return _without_inapplicable(settings, argv if argv is not None else sys.argv[1:], parser, env)


ENV_OF = {"jwt_issuer": "HARNESS_JWT_ISSUER", "jwt_audience": "HARNESS_JWT_AUDIENCE",
          "tenant_claim": "HARNESS_TENANT_CLAIM", "secrets_recheck_s": "HARNESS_SECRETS_RECHECK_SECONDS"}


def _without_inapplicable(settings: GatewaySettings, argv: Sequence[str], parser: CommandParser,
                          env: Mapping[str, str]) -> GatewaySettings:
    """``settings`` once no auth setting is left that its auth mode ignores
    (:func:`inapplicable_auth_settings`).

    One given as a flag is a usage error (exit 2), one line naming the flag and the mode: the
    user asked for something the gateway would silently not do. One that comes from the
    environment is a warning line and is dropped: a variable may be set for a whole
    namespace or shell (a shared ConfigMap) that also runs gateways of another mode.
    """
    flags = {token.partition("=")[0] for token in argv if token.startswith("--")}  # (allow_abbrev is off)
    given = [name for name in ENV_OF if OPTIONS[name] in flags]
    dropped: dict[str, object] = {}
    for name in inapplicable_auth_settings(settings, given):
        if name in given:
            parser.error(inapplicable_message(name, settings, cli=True))
        print(f"{parser.prog}: warning: {inapplicable_message(name, settings, cli=True, shown=ENV_OF[name])} "
              "(ignored)", file=sys.stderr)
        dropped[name] = _DEFAULTS[name]
    return dataclasses.replace(settings, **dropped) if dropped else settings  # type: ignore[arg-type]
