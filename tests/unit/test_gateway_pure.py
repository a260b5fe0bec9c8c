"""The gateway's pure parts: tenant-scoped ids, receipts, views, SSE framing, settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import given
from hypothesis import strategies as st

from harness.ids import session_id_problem, split_tenant_session_id, tenant_session_id
from harness.records import (
    AskOpened,
    InputMessage,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from harness.replay.state import fold
from harness.services.gateway.middleware import session_path, session_url_path
from harness.services.gateway.receipts import receipt_for
from harness.services.gateway.routes import (
    SummaryOut,
    _cursor,
    _from_path,
    _order,
    _parse_cursor,
    _public,
)
from harness.services.gateway.settings import parse_settings
from harness.services.gateway.sse import event_frame
from harness.views import SessionSummary, summarize, timeline

SESSION_IDS = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@~+=-]{0,20}(/[A-Za-z0-9][A-Za-z0-9._:@~+=-]{0,10}){0,3}", fullmatch=True),
    st.text(min_size=1, max_size=40).filter(lambda sid: session_id_problem(sid) is None),
)
"""The ids the gateway takes: the library's (``harness.ids.session_id_problem``), '/' and '%' included."""


@given(tenant=st.text(min_size=1, max_size=30), session_id=SESSION_IDS)
def test_tenant_session_ids_round_trip(tenant: str, session_id: str) -> None:
    log_id = tenant_session_id(tenant, session_id)
    assert split_tenant_session_id(log_id) == (tenant, session_id)
    assert log_id != session_id  # a tenant's id never equals an untenanted one


@given(a=st.tuples(st.text(min_size=1, max_size=10), SESSION_IDS),
       b=st.tuples(st.text(min_size=1, max_size=10), SESSION_IDS))
def test_tenant_session_ids_are_one_to_one(a: tuple[str, str], b: tuple[str, str]) -> None:
    assert (tenant_session_id(*a) == tenant_session_id(*b)) == (a == b)


def test_tenant_session_id_format_is_stable() -> None:
    # never change: these ids are the keys of every record of every tenant's sessions
    assert tenant_session_id("acme", "s-1") == "t/acme/s-1"
    assert tenant_session_id("a/b c", "s-1") == "t/a%2Fb%20c/s-1"
    assert tenant_session_id(None, "s-1") == "s-1"
    assert split_tenant_session_id("s-1") == (None, "s-1")
    assert split_tenant_session_id("t/x") == (None, "t/x")


@given(session_id=SESSION_IDS, tail=st.sampled_from(["", "/events", "/messages"]))
def test_a_session_id_sent_percent_encoded_reaches_its_route_whole(session_id: str, tail: str) -> None:
    from urllib.parse import unquote

    raw = session_url_path(session_id) + tail  # as an HTTP client sends it (a '/' of the id as %2F)
    path = session_path(raw, unquote(raw)) or unquote(raw)  # what the router gets
    segments = path.split("/")
    assert segments[:3] == ["", "v1", "sessions"] and "/".join(segments[4:]) == tail.lstrip("/")
    assert _from_path(segments[3]) == session_id


def test_only_the_session_segment_is_kept_whole() -> None:
    assert session_path("/v1/sessions/a%2Fb/events", "/v1/sessions/a/b/events") == "/v1/sessions/a%2Fb/events"
    assert session_path("/v1/sessions/a%252Fb", "/v1/sessions/a%2Fb") == "/v1/sessions/a%252Fb"  # a '%' stays one
    assert _from_path("a%252Fb") == "a%2Fb"
    assert session_path("/v1/sessions/a/b", "/v1/sessions/a/b") is None  # a real '/' separates
    assert session_path("/v1/sessions/a%2Fb", "/elsewhere") is None  # the server rewrote it: left alone
    assert session_url_path("team/alice", "/gw") == "/gw/v1/sessions/team%2Falice"


def _log(*records: object) -> list[LogEntry]:
    return [LogEntry(i + 1, r) for i, r in enumerate(records)]  # type: ignore[arg-type]


def test_receipts_from_the_log() -> None:
    sid = "s"
    entries = _log(
        InputMessage(sid, 1, "m1", "hi", "h"),
        TurnStarted(sid, 2, "m1", 1),
        InputMessage(sid, 3, "m2", "next", None),
        TurnFinished(sid, 4, "m1", 1, "completed", "ok"),
        InputSettled(sid, 5, "m1", "completed"),
        InputMessage(sid, 6, "m3", "third", None),
    )
    m1 = receipt_for(entries, "m1")
    assert m1 is not None and (m1.status, m1.position) == ("accepted", 1)
    m2 = receipt_for(entries, "m2")
    assert m2 is not None and (m2.status, m2.position) == ("queued", 3)
    m3 = receipt_for(entries, "m3", InputMessage(sid, 99, "m3", "third", None))
    assert m3 is not None and m3.status == "queued"  # m1 had settled by then, m2 had not
    conflict = receipt_for(entries, "m2", InputMessage(sid, 99, "m2", "other text", None))
    assert conflict is not None and (conflict.status, conflict.code) == ("rejected", "input_conflict")
    assert receipt_for(entries, "nope") is None


def test_receipt_of_a_message_behind_an_unsettled_one_is_queued() -> None:
    entries = _log(InputMessage("s", 1, "m1", "hi", "h"), InputMessage("s", 2, "m2", "next", None))
    r = receipt_for(entries, "m2")
    assert r is not None and r.status == "queued"


def test_the_api_shows_harness_views_with_the_callers_id() -> None:
    sid = tenant_session_id("acme", "s")
    entries = _log(
        InputMessage(sid, 10, "m1", "please approve", "h"),
        TurnStarted(sid, 11, "m1", 1),
        ModelResponseRecord(sid, 12, 1, 0, "asking", ({"id": "c1", "name": "approve", "arguments": {}},)),
        ToolStarted(sid, 13, "c1", "approve", 1),
        AskOpened(sid, 14, "c1", "approval", "Approve?", {"type": "object"}),
    )
    summary = summarize(fold(sid, entries), now_ms=20, last_activity_ms=14)
    data = _public(summary, "s")
    assert data == {**summary.to_json(), "session_id": "s"}  # the log's id never leaves
    assert data["state"] == "waiting" and [a["name"] for a in data["open_asks"]] == ["approval"]
    assert json.loads(json.dumps(data)) == data
    SummaryOut.model_validate(data)  # the response model takes the view as it is
    assert [item.kind for item in timeline(entries)] == [
        "input.message", "turn.started", "model.response", "tool.started", "ask"]


@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2**45)), SESSION_IDS), unique_by=lambda r: r[1]))
def test_list_cursors_page_through_the_catalogs_order(rows: list[tuple[int | None, str]]) -> None:
    keys = sorted(_order(SessionSummary(sid, None, "idle", last_activity=ts), sid) for ts, sid in rows)
    seen = []
    after = None
    while True:
        page = [k for k in keys if after is None or k > after][:2]
        seen += page
        if not page:
            break
        after = _parse_cursor(_cursor(page[-1]))
        assert after == page[-1]
    assert seen == keys
    assert _parse_cursor(None) is None and _parse_cursor("") is None
    for junk in ("junk", "12.", ".s-1", "x.s-1"):  # a cursor the API never gave: 422, not the start again
        with pytest.raises(RequestValidationError) as refused:  # (a 422 with its place: query, cursor)
            _parse_cursor(junk)
        assert [e["loc"] for e in refused.value.errors()] == [("query", "cursor")]


def test_sse_frames() -> None:
    assert event_frame("hello", {"a": 1}) == b'event: hello\ndata: {"a":1}\n\n'
    assert event_frame("x", {"t": "a\nb"}, id=7) == b'id: 7\nevent: x\ndata: {"t":"a\\nb"}\n\n'


def test_settings_need_auth_or_open_access(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--log", "sqlite:///x.db"], {})
    assert exc.value.code == 2 and "--open-access" in capsys.readouterr().err
    s = parse_settings(["--open-access"], {"HARNESS_LOG": "sqlite:///x.db", "HARNESS_APPS": "a:b,c:d",
                                           "HARNESS_GATEWAY_PORT": "9000"})
    assert (s.log, s.apps, s.port, s.open_access) == ("sqlite:///x.db", ("a:b", "c:d"), 9000, True)
    s = parse_settings(["--log", "x", "--jwt-secret-file", "k", "--tenant-claim", "org"], {})
    assert s.has_auth and s.tenant_claim == "org" and not s.open_access
    with pytest.raises(SystemExit):
        parse_settings(["--log", "x", "--jwt-secret-file", "a", "--jwks-file", "b"], {})
    with pytest.raises(SystemExit):
        parse_settings(["--log", "x", "--open-access", "--port", "70000"], {})


@pytest.mark.parametrize(("mode", "flag", "said"), [
    (["--open-access"], ["--tenant-claim", "org"], "--tenant-claim does not apply to open access (--open-access, "
     "no auth file): only JWTs are checked against it; give --jwt-secret-file or --jwks-file to accept JWTs, or "
     "drop --tenant-claim"),
    (["--open-access"], ["--jwt-issuer=https://id.example.com"], "--jwt-issuer does not apply to open access"),
    (["--api-keys-file", "k"], ["--jwt-audience", "harness"], "--jwt-audience does not apply to API-key "
     "authentication (--api-keys-file): only JWTs"),
    (["--api-keys-file", "k", "--open-access"], ["--tenant-claim", "tenant"], "--tenant-claim does not apply to "
     "API-key authentication (--api-keys-file, --open-access)"),
    (["--open-access"], ["--secrets-recheck", "2"], "--secrets-recheck does not apply to open access (--open-access, "
     "no auth file): it is how often the auth files (and harness serve's --secrets-dir) are looked at"),
])
def test_an_auth_flag_the_chosen_mode_ignores_is_a_usage_error(
    mode: list[str], flag: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given with a mode that does nothing with it, an auth flag was silently ignored (an
    issuer "checked" on API keys). One line names the flag and the mode; exit 2."""
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--log", "x", *mode, *flag], {})
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"harness gateway: {said}") and err.rstrip().endswith("(see 'harness gateway --help')")


def test_auth_flags_that_apply_to_the_mode_pass(capsys: pytest.CaptureFixture[str]) -> None:
    jwt = ["--log", "x", "--jwks-file", "j", "--api-keys-file", "k"]
    s = parse_settings([*jwt, "--jwt-issuer", "i", "--jwt-audience", "a", "--tenant-claim", "org",
                        "--secrets-recheck", "2"], {})
    assert (s.jwt_issuer, s.jwt_audience, s.tenant_claim, s.secrets_recheck_s) == ("i", "a", "org", 2)
    assert parse_settings(["--log", "x", "--api-keys-file", "k", "--secrets-recheck", "2"], {}).secrets_recheck_s == 2
    serve = ["--log", "x", "--open-access", "--app", "a:b", "--secrets-dir", "d", "--secrets-recheck", "2"]
    assert parse_settings(serve, {}, worker=True).secrets_recheck_s == 2  # (serve's worker looks at its folder)
    assert capsys.readouterr().err == ""


def test_an_auth_variable_the_chosen_mode_ignores_is_a_warning_and_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    """A variable may be set for a whole namespace (a ConfigMap shared by gateways of two
    modes): it is not refused, but the start says it does nothing here."""
    env = {"HARNESS_LOG": "x", "HARNESS_TENANT_CLAIM": "org", "HARNESS_JWT_ISSUER": "https://id.example.com"}
    s = parse_settings(["--api-keys-file", "k"], env)
    assert (s.tenant_claim, s.jwt_issuer) == ("tenant", None)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "harness gateway: warning: HARNESS_JWT_ISSUER does not apply to API-key authentication (--api-keys-file): "
        "only JWTs are checked against it; give --jwt-secret-file or --jwks-file to accept JWTs, or drop "
        "HARNESS_JWT_ISSUER (ignored)",
        "harness gateway: warning: HARNESS_TENANT_CLAIM does not apply to API-key authentication (--api-keys-file): "
        "only JWTs are checked against it; give --jwt-secret-file or --jwks-file to accept JWTs, or drop "
        "HARNESS_TENANT_CLAIM (ignored)",
    ]
    assert parse_settings(["--jwt-secret-file", "k"], env).tenant_claim == "org"  # (where it applies: taken)
    assert capsys.readouterr().err == ""


def test_gateway_settings_with_an_auth_setting_the_mode_ignores_are_refused(tmp_path: Path) -> None:
    """The library's entry point (``create_app`` -> ``Authenticator``) says so too: a typed error."""
    from harness.log.memory import MemoryLog
    from harness.services.gateway.app import create_app
    from harness.services.gateway.auth import Authenticator, GatewayConfigError
    from harness.services.gateway.settings import GatewaySettings

    keys = tmp_path / "keys"
    keys.write_text("acme key-1\n")
    with pytest.raises(GatewayConfigError) as refused:
        create_app(GatewaySettings(log="memory:", api_keys_file=str(keys), jwt_issuer="https://id.example.com"),
                   log=MemoryLog())
    assert str(refused.value) == (
        "jwt_issuer does not apply to API-key authentication (api_keys_file): only JWTs are checked against it; "
        "give jwt_secret_file or jwks_file to accept JWTs, or drop jwt_issuer")
    with pytest.raises(GatewayConfigError, match=r"^tenant_claim does not apply to open access"):
        Authenticator(GatewaySettings(log="memory:", open_access=True, tenant_claim="org"))
    with pytest.raises(GatewayConfigError, match=r"^secrets_recheck_s does not apply to open access"):
        Authenticator(GatewaySettings(log="memory:", open_access=True, secrets_recheck_s=1))
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    assert Authenticator(GatewaySettings(log="memory:", jwt_secret_file=str(secret), tenant_claim="org",
                                         jwt_issuer="i")).tenant_claim == "org"


def test_settings_take_kafka_client_config_from_the_environment() -> None:
    env = {"HARNESS_LOG": "kafka://b:9092", "HARNESS_KAFKA_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
           "HARNESS_KAFKA_CONFIG_SASL_PASSWORD": "pw"}
    s = parse_settings(["--open-access"], env)
    assert dict(s.kafka_config) == {"security.protocol": "SASL_SSL", "sasl.password": "pw"}


def test_serve_takes_the_worker_drain_timeout_as_the_worker_does(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--log", "sqlite:///x.db", "--open-access", "--app", "a:b"]
    assert parse_settings(base, {}, worker=True).drain_timeout_s == 20
    assert parse_settings([*base, "--drain-timeout", "0"], {}, worker=True).drain_timeout_s == 0
    assert parse_settings(base, {"HARNESS_DRAIN_TIMEOUT_SECONDS": "45"}, worker=True).drain_timeout_s == 45
    with pytest.raises(SystemExit):
        parse_settings([*base, "--drain-timeout", "-1"], {}, worker=True)
    assert "--drain-timeout: must be a number of seconds >= 0, not -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the gateway alone drives no session: no such flag
        parse_settings([*base, "--drain-timeout", "5"], {})


def test_readiness_asks_the_log_at_every_check_not_only_at_start() -> None:
    """A started Kafka log goes on without asking the broker: the gateway said ready for
    the whole of a broker outage. Readiness asks ``check_reachable`` each time."""
    from fastapi.testclient import TestClient

    from harness.errors import LogUnavailable
    from harness.log.memory import MemoryLog
    from harness.services.gateway.app import create_app
    from harness.services.gateway.settings import GatewaySettings

    class Outage(MemoryLog):
        down = False

        async def start(self) -> None:
            pass

        async def check_reachable(self, timeout: float) -> None:
            if self.down:
                raise LogUnavailable(f"the Kafka cluster at b:9092 did not answer within {timeout:g} s")

    log = Outage()
    app = create_app(GatewaySettings(log="memory:", open_access=True), log=log)
    with TestClient(app, base_url="http://localhost") as http:  # (a loopback gateway answers loopback names only)
        assert http.get("/readyz").json() == {"status": "ready"}
        log.down = True
        r = http.get("/readyz")
        assert r.status_code == 503
        assert r.json()["detail"] == "not ready: the Kafka cluster at b:9092 did not answer within 5 s"
        log.down = False
        assert http.get("/readyz").status_code == 200



def test_the_gateway_refuses_an_empty_message_text_as_harness_send_does() -> None:
    from pydantic import ValidationError

    from harness.services.gateway.routes import MessageIn

    with pytest.raises(ValidationError):
        MessageIn(text="")
    assert MessageIn(text="x").text == "x"
