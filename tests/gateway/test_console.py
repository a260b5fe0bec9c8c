"""The web console in a real browser: Playwright driving Debian's chromium.

Open the console, see a waiting session in the list, open it, answer its ask in the
form generated from the ask's schema, see the turn complete live; a screenshot is
saved as a test artefact (HARNESS_TEST_ARTIFACTS, default build/test-artifacts)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI
from tests.gateway.helpers import ARTIFACTS, HARNESS, ServerThread, wait_for

CHROMIUM = os.environ.get("HARNESS_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"playwright is not installed: {exc}", pytrace=False)
        pytest.skip("playwright is not installed")
    if shutil.which(CHROMIUM) is None:
        if IN_CI:
            pytest.fail(f"no chromium at {CHROMIUM}: apt-get install chromium", pytrace=False)
        pytest.skip(f"no chromium at {CHROMIUM}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def test_console_answers_an_ask_and_sees_the_turn_complete(served: ServerThread, http: httpx.Client,
                                                           browser: Any) -> None:
    r = http.post("/v1/sessions/order-42/messages",
                  json={"text": "please approve the refund of order 42", "harness": HARNESS, "input_id": "in-1"})
    assert r.json()["status"] == "accepted"
    wait_for(lambda: http.get("/v1/sessions/order-42").json()["summary"]["state"] == "waiting",
             timeout=30, what="the session to wait for a person")

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served.url + "/")
    row = page.locator('#sessions tr[data-session="order-42"]')
    row.wait_for(timeout=20_000)
    assert row.locator("[data-state]").inner_text() == "waiting"
    row.locator("a").click()

    form = page.locator('form[data-ask="approval"]')
    form.wait_for(timeout=20_000)
    assert "Approve please approve the refund of order 42?" in form.inner_text()
    page.locator("#stream-state").filter(has_text="live").wait_for(timeout=20_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console-waiting.png"), full_page=True)
    form.locator('input[name="approved"]').check()
    form.locator('input[name="note"]').fill("looks right")
    form.locator('button[type="submit"]').click()

    # the SSE stream brings the rest of the turn; the page re-reads the session's view
    page.locator("#timeline li", has_text="turn 1 completed").wait_for(timeout=30_000)
    page.locator('#summary [data-state="idle"]').wait_for(timeout=20_000)
    assert page.locator('form[data-ask="approval"]').count() == 0
    # each line reads as `harness show` prints it
    answered = page.locator('#timeline li[data-kind="ask.answered"] .what')
    assert answered.inner_text() == 'approval [approve-1] = {"approved":true,"note":"looks right"}'
    ask = page.locator('#timeline li[data-kind="ask"] .what').inner_text()
    assert ask == ('approval [approve-1] "Approve please approve the refund of order 42?" → '
                   '{"approved":true,"note":"looks right"}')
    shot = ARTIFACTS / "console-turn-completed.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000

    # the message box sends a new message; its answer shows up live
    page.locator('#message-box input[name="text"]').fill("thanks")
    page.locator('#message-box button[type="submit"]').click()
    page.locator("#timeline li", has_text="turn 2 completed \"echo: thanks\"").wait_for(timeout=30_000)
    assert errors == []
    # the session's usage totals, as `harness show` prints them in its header
    page.locator("#usage", has_text="3 model calls: 150 in / 15 out tokens").wait_for(timeout=20_000)
    d = http.get("/v1/sessions/order-42").json()
    assert d["summary"]["turns"] == 2
    assert d["transcript"][-1] == {"role": "assistant", "content": "echo: thanks"}


def test_console_filters_the_list_by_state_and_pages_through_older_sessions(
    served: ServerThread, http: httpx.Client, browser: Any
) -> None:
    """The list shows a page of sessions (the API's paging, not everything at once), a
    "more sessions" button while there are more, and a state filter kept in the URL."""
    for sid in ("p-1", "p-2", "p-3"):
        http.post(f"/v1/sessions/{sid}/messages", json={"text": "hello", "harness": HARNESS})
    http.post("/v1/sessions/p-4/messages", json={"text": "please approve order 4", "harness": HARNESS})
    wait_for(lambda: {s["session_id"]: s["state"] for s in http.get("/v1/sessions").json()["sessions"]}
             == {"p-1": "idle", "p-2": "idle", "p-3": "idle", "p-4": "waiting"},
             timeout=30, what="three idle sessions and one waiting")

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served.url + "/#/?limit=3")
    rows = page.locator("#sessions tbody tr[data-session]")
    rows.first.wait_for(timeout=20_000)
    assert rows.count() == 3
    page.locator("#more-sessions").click()
    page.locator('#sessions tr[data-session]').nth(3).wait_for(timeout=20_000)
    shown = [rows.nth(i).get_attribute("data-session") for i in range(rows.count())]
    assert sorted(shown) == ["p-1", "p-2", "p-3", "p-4"]  # each once
    assert page.locator("#more-sessions").is_hidden()

    page.locator("#state-filter").select_option("waiting")
    page.wait_for_url("**/#/?state=waiting")
    page.locator('#sessions tr[data-session="p-4"]').wait_for(timeout=20_000)
    page.locator('#sessions tr[data-session="p-1"]').wait_for(state="detached", timeout=20_000)
    assert rows.count() == 1 and page.locator("#more-sessions").is_hidden()
    page.locator("#state-filter").select_option("failed")
    page.locator("#sessions td.muted", has_text="no failed sessions").wait_for(timeout=20_000)
    assert errors == []


def test_console_shows_when_an_ask_expires_and_takes_its_form_away_live(served: ServerThread, http: httpx.Client,
                                                                        browser: Any) -> None:
    r = http.post("/v1/sessions/rush-1/messages",
                  json={"text": "approve quickly the refund", "harness": HARNESS, "input_id": "in-1"})
    assert r.json()["status"] == "accepted"
    wait_for(lambda: http.get("/v1/sessions/rush-1").json()["open_asks"], timeout=30, what="the ask to open")

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served.url + "/#/s/rush-1")
    form = page.locator('form[data-ask="approval"]')
    form.wait_for(timeout=20_000)
    assert " · expires " in form.inner_text()  # a person sees how long they have
    # nobody answers: the tool's wait ends, its result and the turn's end come live
    page.locator("#timeline li", has_text="turn 1 completed").wait_for(timeout=30_000)
    assert page.locator('form[data-ask="approval"]').count() == 0
    ask = page.locator('#timeline li[data-kind="ask"] .what').inner_text()
    assert ask.startswith("approval [approve-1]") and ask.endswith("(expired)"), ask
    result = page.locator('#timeline li[data-kind="tool.result"] .what').inner_text()
    assert "nobody answered in time" in result, result
    page.screenshot(path=str(ARTIFACTS / "console-ask-expired.png"), full_page=True)
    assert errors == []


def test_console_starts_and_opens_a_session_whose_id_holds_a_slash(served: ServerThread, http: httpx.Client,
                                                                  browser: Any) -> None:
    """``team/alice`` (as ``harness send team/alice`` makes): started from the console's form,
    listed, opened, its ask answered and its turn seen live; every URL holds it as team%2Falice."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(served.url + "/")
    form = page.locator("#new-session")
    form.wait_for(timeout=20_000)
    form.locator('input[name="session_id"]').fill("team/alice")
    form.locator('input[name="text"]').fill("please approve the refund")
    form.locator('button[type="submit"]').click()
    page.wait_for_url("**/#/s/team%2Falice")
    ask = page.locator('form[data-ask="approval"]')
    ask.wait_for(timeout=30_000)
    page.locator("#stream-state").filter(has_text="live").wait_for(timeout=20_000)
    ask.locator('input[name="approved"]').check()
    ask.locator('button[type="submit"]').click()
    page.locator("#timeline li", has_text="turn 1 completed").wait_for(timeout=30_000)
    page.goto(served.url + "/#/")
    row = page.locator('#sessions tr[data-session="team/alice"]')
    row.wait_for(timeout=20_000)
    assert row.locator("a").get_attribute("href") == "#/s/team%2Falice"
    assert http.get("/v1/sessions/team%2Falice").json()["summary"]["state"] == "idle"
    assert errors == [] and failed == []


XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>"\'><svg onload="window.__xss=3">'


def test_console_shows_what_a_session_holds_as_text_never_as_markup(served: ServerThread, http: httpx.Client,
                                                                     browser: Any) -> None:
    """A message, the model's answer, an ask's message, a tool's arguments and an app record,
    all the attacker's text, are shown as text; the page's CSP forbids inline script anyway."""
    r = http.post("/v1/sessions/x-1/messages?wait=30", json={"text": "approve " + XSS, "harness": HARNESS})
    assert r.json()["settlement"]["outcome"] == "waiting"
    assert http.post("/v1/sessions/x-1/records", json={"records": [{"type": "app.note", "name": XSS, XSS: XSS}]}
                     ).json()["status"] == "accepted"
    assert http.post("/v1/sessions/x-2/messages?wait=30", json={"text": XSS, "harness": HARNESS}
                     ).json()["settlement"]["outcome"] == "completed"
    page = browser.new_page()
    page.goto(served.url + "/")
    page.locator('#sessions tr[data-session="x-2"]').wait_for(timeout=20_000)
    for sid in ("x-1", "x-2"):
        page.goto(f"{served.url}/#/s/{sid}")
        page.locator("#stream-state").filter(has_text="live").wait_for(timeout=20_000)
        assert page.locator("#timeline li").count() >= 3
        assert XSS.split(">")[0] in page.locator("#timeline").inner_text()  # shown, as text
        assert page.locator("main img, main svg, main script").count() == 0
        assert page.evaluate("window.__xss") is None
    page.goto(f"{served.url}/#/s/x-1")
    heading = page.locator('form[data-ask="approval"] h3')
    heading.wait_for(timeout=20_000)
    assert heading.inner_text().startswith('Approve approve <img src=x onerror="window.__xss=1">')
    assert page.evaluate("window.__xss") is None


def test_console_keeps_a_token_for_the_tab_only(served: ServerThread, browser: Any) -> None:
    """A bearer token given to the console was kept in localStorage: on the machine, for
    whoever opens that browser next. It lives in sessionStorage now: for the tab's life."""
    page = browser.new_page()
    page.goto(served.url + "/")
    page.locator("#sessions").wait_for(timeout=20_000)
    page.evaluate("document.getElementById('token-form').hidden = false")
    page.locator("#token").fill("tok-123")
    page.locator('#token-form button[type="submit"]').click()
    assert page.evaluate("sessionStorage.getItem('harness.token')") == "tok-123"
    assert page.evaluate("localStorage.getItem('harness.token')") is None
    page.reload(wait_until="load")
    assert page.evaluate("sessionStorage.getItem('harness.token')") == "tok-123"  # a reload keeps it


def test_the_api_reference_renders_with_every_other_origin_blocked(served: ServerThread, http: httpx.Client,
                                                                    browser: Any) -> None:
    """``/docs`` loaded Swagger UI from a CDN: blank offline or behind a firewall. Every
    request to another origin is refused here (as a machine without internet would), and
    the page still shows the API's operations, its "Try it out" reaching the gateway."""
    elsewhere: list[str] = []

    def only_the_gateway(route: Any) -> None:
        if route.request.url.startswith(served.url + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.route("**/*", only_the_gateway)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)  # (a CSP refusal too)
    page.goto(served.url + "/docs")
    operations = page.locator(".opblock")
    page.locator(".opblock-summary-path", has_text="/v1/sessions/{session_id}/messages").wait_for(timeout=20_000)
    paths = {operations.nth(i).locator(".opblock-summary-path").inner_text() for i in range(operations.count())}
    assert set(http.get("/openapi.json").json()["paths"]) <= paths
    # open one and call it from the page: the gateway answers (open access: no token)
    healthz = page.locator(".opblock", has=page.locator(".opblock-summary-path", has_text="/healthz")).first
    healthz.locator(".opblock-summary").click()
    healthz.locator("button.try-out__btn").click()
    healthz.locator("button.execute").click()
    healthz.locator(".response .response-col_status", has_text="200").first.wait_for(timeout=20_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "api-reference.png"))
    assert elsewhere == [] and errors == []
