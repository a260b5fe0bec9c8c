"""The API reference page ``/docs`` is served by the gateway itself: nothing from a CDN.

FastAPI's own page loads Swagger UI from cdn.jsdelivr.net, so it was blank on a machine
without internet or behind a firewall (the browser test in test_console.py renders it with
every other origin blocked)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from fastapi.testclient import TestClient

from harness.log.memory import MemoryLog
from harness.services.gateway.app import create_app
from harness.services.gateway.middleware import DOCS_CSP
from harness.services.gateway.settings import GatewaySettings


class _Refs(HTMLParser):
    """Every URL a page makes the browser load (src, href)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls.extend(value for name, value in attrs if name in ("src", "href") and value)


def test_docs_loads_nothing_from_another_origin_and_needs_no_token(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("acme key-acme-1234\n")
    app = create_app(GatewaySettings(log="memory:", api_keys_file=str(keys)), log=MemoryLog())
    with TestClient(app, base_url="http://localhost") as http:
        page = http.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert not re.search(r"https?://", page.text), "the page names another origin"
        refs = _Refs()
        refs.feed(page.text)
        assert len(refs.urls) == 3  # Swagger UI's style and script, and ours that starts it
        for url in refs.urls:
            assert url.startswith("/docs/assets/"), url
            asset = http.get(url)  # (no token: the page and its files describe the API, as /openapi.json)
            assert asset.status_code == 200, url
            assert asset.headers["content-type"].split(";")[0] in ("text/css", "text/javascript"), url
            assert len(asset.content) > 100, url
        assert "/openapi.json" in http.get("/docs/assets/docs.js").text
        assert http.get("/openapi.json").status_code == 200
        assert http.get("/v1/sessions").status_code == 401  # the API itself still needs one
        # the page's CSP runs the gateway's own scripts only, and lets it call nothing else
        assert page.headers["content-security-policy"] == DOCS_CSP
        for directive in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
            assert directive in DOCS_CSP
        assert "unsafe-inline" not in DOCS_CSP and "http" not in DOCS_CSP
        # nothing else is served from the assets' folder; ReDoc (a CDN page too) is off
        assert http.get("/docs/assets/index.css").status_code == 404
        assert http.get("/docs/assets/..%2Fapp.js").status_code == 404
        assert http.get("/redoc").status_code == 404
        assert http.get("/docs/oauth2-redirect").status_code == 404
