"""The web console used as a person would (chromium, through Playwright): a token typed
wrong, an ask whose schema has an optional text and a bounded number, an answer streamed
and the page reloaded half-way through it, the gateway out of reach, a long word on a
phone-sized screen, and /docs's "Authorize" with the token alone.

The gateway runs behind an API key here (``--api-keys-file``), with a harness of its own:
a model that streams its answer in pieces and can be held between two pieces."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from harness import define_harness, durable_tool, tool_definition
from harness.models import ModelResponse, ToolCall, Usage
from harness.services.gateway.settings import GatewaySettings
from tests.gateway.helpers import ServerThread, wait_for
from tests.gateway.test_console import browser  # noqa: F401 - the fixture

KEY = "key-of-acme-0123456789"
NAME = "tests/console-use"
PIECES = ["The answer ", "comes in ", "four pieces", " of text."]
ANSWER = "".join(PIECES)


class Review(BaseModel):
    approved: bool
    priority: Literal["low", "normal", "high"]
    count: int = Field(ge=1, le=10)
    note: str | None = None


class ReviewArgs(BaseModel):
    what: str


async def review_impl(args: ReviewArgs, ctx: Any) -> dict[str, Any]:
    answer = await ctx.step.ask("review", message=f"Review {args.what}?", schema=Review)
    return answer.model_dump()


class Gates:
    """Holds the streaming model after its 2nd and its 3rd piece until the test opens the gate."""

    def __init__(self) -> None:
        self.after = {2: threading.Event(), 3: threading.Event()}
        self.reached = {2: threading.Event(), 3: threading.Event()}


class HeldStreamer:
    def __init__(self, gates: Gates) -> None:
        self.gates = gates

    async def complete(self, messages: list[dict[str, Any]], tools: Any = (), *, stream: Any = None) -> ModelResponse:
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        user, tail = messages[last]["content"], messages[last + 1:]
        usage = Usage(input_tokens=1, output_tokens=1, model="held")
        if any(m["role"] == "tool" for m in tail):
            return ModelResponse(text="reviewed", usage=usage)
        if user.startswith("review"):
            return ModelResponse(text="asking", tool_calls=[ToolCall(id="rev-1", name="review", arguments={"what": user})],
                                 usage=usage)
        if not user.startswith("stream"):
            return ModelResponse(text="echo: " + user, usage=usage)
        for i, piece in enumerate(PIECES, start=1):
            if stream:
                stream(piece)
            if i in self.gates.after:
                self.gates.reached[i].set()
                while not self.gates.after[i].is_set():
                    await asyncio.sleep(0.02)
        return ModelResponse(text=ANSWER, usage=usage)


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
def keyed(tmp_path: Path, gates: Gates) -> Iterator[ServerThread]:
    keys = tmp_path / "keys"
    keys.write_text(f"acme {KEY}\n")
    tool = durable_tool(tool_definition(name="review", description="ask a person", input_schema=ReviewArgs),
                        review_impl)
    harness = define_harness(name=NAME, model=HeldStreamer(gates), tools=[tool])
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(keys), heartbeat_s=0.3)
    with ServerThread(settings, harnesses=[harness], worker=True) as server:
        yield server


@pytest.fixture
def api(keyed: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=keyed.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def signed_in(browser: Any, **kw: Any) -> Any:  # noqa: F811
    context = browser.new_context(**kw)
    context.add_init_script(f"sessionStorage.setItem('harness.token', '{KEY}')")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    return page


def test_a_refused_token_says_so_and_the_right_one_opens_the_list(keyed: ServerThread, browser: Any) -> None:  # noqa: F811
    """A token typed wrong got the very prompt a missing one gets ("sign in: paste a bearer
    token above"): the person could not tell that the token they gave was refused."""
    page = browser.new_page()
    page.goto(keyed.url + "/")
    main = page.locator("main")
    main.filter(has_text="sign in: paste a bearer token above").wait_for(timeout=20_000)
    page.locator("#token").fill("not-the-key")
    page.locator('#token-form button[type="submit"]').click()
    main.filter(has_text="the token was refused (unknown API key)").wait_for(timeout=20_000)
    assert page.locator("#token-form").is_visible()
    page.locator("#token").fill(KEY)
    page.locator('#token-form button[type="submit"]').click()
    page.locator("#new-session").wait_for(timeout=20_000)
    assert page.locator("#token-form").is_hidden()


def test_an_optional_text_of_an_ask_is_a_text_field_and_a_bounded_number_says_its_bounds(
    keyed: ServerThread, api: httpx.Client, browser: Any  # noqa: F811
) -> None:
    """``note: str | None = None`` (JSON schema ``anyOf: [string, null]``) was a "JSON" box
    holding ``null``: a person typing ``looks good`` got the browser's JSON.parse error."""
    assert api.post("/v1/sessions/r-1/messages?wait=30", json={"text": "review order 7", "harness": NAME}
                    ).json()["settlement"]["outcome"] == "waiting"
    page = signed_in(browser)
    page.goto(keyed.url + "/#/s/r-1")
    form = page.locator('form[data-ask="review"]')
    form.wait_for(timeout=20_000)
    note = form.locator('[name="note"]')
    assert note.evaluate("n => n.tagName + ':' + n.type + ':' + n.value") == "INPUT:text:"
    count = form.locator('input[name="count"]')
    assert (count.get_attribute("min"), count.get_attribute("max")) == ("1", "10")
    count.fill("11")
    form.locator('button[type="submit"]').click()
    assert "10" in count.evaluate("n => n.validationMessage")  # the browser says the bound, before sending
    count.fill("3")
    form.locator('select[name="priority"]').select_option(label="high")
    note.fill("looks good")
    form.locator('button[type="submit"]').click()
    page.locator('#summary [data-state="idle"]').wait_for(timeout=20_000)
    answered = api.get("/v1/sessions/r-1").json()["timeline"]
    assert [it["preview"] for it in answered if it["kind"] == "ask.answered"] == [
        '{"approved":false,"priority":"high","count":3,"note":"looks good"}']
    # an optional text left empty is left out (the schema's default, null, applies), not sent as ""
    assert api.post("/v1/sessions/r-2/messages?wait=30", json={"text": "review order 8", "harness": NAME}
                    ).json()["settlement"]["outcome"] == "waiting"
    page.goto(keyed.url + "/#/s/r-2")
    form.wait_for(timeout=20_000)
    form.locator('input[name="count"]').fill("1")
    form.locator('button[type="submit"]').click()
    page.locator('#summary [data-state="idle"]').wait_for(timeout=20_000)
    answered = api.get("/v1/sessions/r-2").json()["timeline"]
    assert [it["preview"] for it in answered if it["kind"] == "ask.answered"] == [
        '{"approved":false,"priority":"low","count":1}']
    assert page.errors == []


def test_the_answer_stays_readable_and_a_reload_half_way_gets_its_start_back(
    keyed: ServerThread, api: httpx.Client, gates: Gates, browser: Any  # noqa: F811
) -> None:
    """The streamed text was wiped when the response was logged (the whole answer was then
    nowhere on the page: the timeline cuts it at 100 characters), and a page reloaded
    half-way through an answer showed its tail as if it were all of it (later: marked
    "… " where its start was missed; now the gateway gives the start back)."""
    assert api.post("/v1/sessions/a-1/messages?wait=30", json={"text": "hello", "harness": NAME}
                    ).json()["settlement"]["outcome"] == "completed"
    page = signed_in(browser)
    page.goto(keyed.url + "/#/s/a-1")
    live = page.locator("#live")
    page.locator("#stream-state").filter(has_text="live").wait_for(timeout=20_000)
    assert live.inner_text() == "echo: hello"  # the last answer, on opening the page
    page.locator('#message-box input[name="text"]').fill("stream please")
    page.locator('#message-box button[type="submit"]').click()
    assert gates.reached[2].wait(20)
    wait_for(lambda: live.inner_text() == "The answer comes in ", timeout=20, what="the first two pieces, live")
    page.reload()
    page.locator("#stream-state").filter(has_text="live").wait_for(timeout=20_000)
    wait_for(lambda: live.inner_text() == "The answer comes in ", timeout=20, what="the start, given back")
    gates.after[2].set()
    assert gates.reached[3].wait(20)
    wait_for(lambda: live.inner_text() == "The answer comes in four pieces", timeout=20,
             what="the third piece after the start given back")
    gates.after[3].set()
    page.locator("#timeline li", has_text="turn 2 completed").wait_for(timeout=20_000)
    wait_for(lambda: live.inner_text() == ANSWER, timeout=20, what="the whole answer, from the log")
    page.locator('#message-box input[name="text"]').fill("again")
    page.locator('#message-box button[type="submit"]').click()
    page.locator("#timeline li", has_text="turn 3 completed").wait_for(timeout=20_000)
    wait_for(lambda: live.inner_text() == "echo: again", timeout=20, what="the next answer in its place")
    assert page.errors == []


def test_a_gateway_out_of_reach_is_said_in_words(keyed: ServerThread, browser: Any) -> None:  # noqa: F811
    """A message sent while the gateway was down said "Failed to fetch" (the browser's words)."""
    page = signed_in(browser)
    page.goto(keyed.url + "/")
    page.locator("#new-session").wait_for(timeout=20_000)
    page.route("**/v1/sessions/d-1/messages", lambda route: route.abort("connectionrefused"))
    page.locator('#new-session input[name="session_id"]').fill("d-1")
    page.locator('#new-session input[name="text"]').fill("hello")
    page.locator('#new-session button[type="submit"]').click()
    receipt = page.locator("#new-session .receipt")
    receipt.filter(has_text="the gateway cannot be reached").wait_for(timeout=20_000)
    assert "try again once it is back" in receipt.inner_text()


def test_an_event_stream_refused_its_token_stops_and_says_so(keyed: ServerThread, api: httpx.Client,
                                                             browser: Any) -> None:  # noqa: F811
    """A token revoked while a session's page is open: its event stream was refused (401)
    and the page retried every second for good, "reconnecting…", never saying why."""
    assert api.post("/v1/sessions/r-1/messages", json={"text": "hello", "harness": NAME}).status_code == 200
    page = signed_in(browser)
    requests: list[str] = []

    def refuse(route: Any) -> None:
        requests.append(route.request.url)
        route.fulfill(status=401, content_type="application/json", body='{"detail": "unknown API key"}')

    page.route("**/v1/sessions/r-1/events", refuse)
    page.goto(keyed.url + "/#/s/r-1")
    state = page.locator("#stream-state")
    state.filter(has_text="the token was refused").wait_for(timeout=20_000)
    assert page.locator("#token-form").is_visible()  # (before: "reconnecting…", retried every second)
    assert requests and "the token was refused" in state.inner_text()


def test_a_long_word_wraps_on_a_phone_sized_screen(keyed: ServerThread, api: httpx.Client,
                                                   browser: Any) -> None:  # noqa: F811
    """A long word (a URL, a token, JSON) in a message or an answer made the session page
    wider than the screen (the timeline's grid column and the live text did not wrap)."""
    word = "L" * 3000
    assert api.post("/v1/sessions/w-1/messages?wait=30", json={"text": word, "harness": NAME}
                    ).json()["settlement"]["outcome"] == "completed"
    page = signed_in(browser, viewport={"width": 390, "height": 800})
    page.goto(keyed.url + "/#/s/w-1")
    page.locator("#stream-state").filter(has_text="live").wait_for(timeout=20_000)
    page.locator("#timeline li", has_text="turn 1 completed").wait_for(timeout=20_000)
    page.locator("#live").filter(has_text="LLLL").wait_for(timeout=20_000)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    badge = page.locator("#summary [data-state]")
    assert badge.bounding_box()["height"] < 30  # one line, not a letter a line


def test_the_api_reference_authorizes_with_the_token_alone(keyed: ServerThread, browser: Any) -> None:  # noqa: F811
    """The OpenAPI document declared the token as an ``apiKey`` in the Authorization header:
    Swagger UI's "Authorize" then wanted ``Bearer `` typed before the token (its description,
    "'Bearer <token>'", showed as "'Bearer '"), and the token alone got a 401 when tried out."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(keyed.url + "/docs")
    page.locator("button.authorize").first.click()
    page.locator(".modal-ux input").first.fill(KEY)
    page.locator(".modal-ux button.authorize").click()
    page.locator(".modal-ux button.close-modal").click()
    op = page.locator(".opblock", has=page.locator(".opblock-summary-path", has_text="/v1/harnesses")).first
    op.locator(".opblock-summary").click()
    op.locator("button.try-out__btn").click()
    op.locator("button.execute").click()
    status = op.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for(timeout=20_000)
    assert status.inner_text().strip() == "200"
    assert NAME in op.locator(".live-responses-table tbody .response-col_description").first.inner_text()
