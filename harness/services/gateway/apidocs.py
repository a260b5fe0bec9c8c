"""The API's reference page, ``/docs``: Swagger UI served by the gateway itself, offline.

FastAPI's own ``/docs`` and ``/redoc`` load their scripts and styles from a CDN
(cdn.jsdelivr.net): on a machine without internet, or behind a firewall that stops it, the
page stays blank. The gateway turns those off and serves Swagger UI from the files of the
``fastapi-offline`` package (MIT, Swagger UI 5; in the ``gateway`` extra) under
``/docs/assets/``, with a page and a start script of its own: no inline script, so its
Content-Security-Policy (:data:`~harness.services.gateway.middleware.DOCS_CSP`) allows the
gateway's own scripts only, and the browser fetches nothing from another origin.

``/redoc`` is not served: one reference page is enough, and ReDoc injects its styles at run
time (it would need ``style-src 'unsafe-inline'``). Like ``/openapi.json`` and the console's
files, the page and its assets need no token: they describe the API, they do not use it
(Swagger UI's "Authorize" takes a bearer token for the calls it makes, which are checked as
any other).
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Path
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["ASSETS", "DOCS_PATH", "install_docs", "swagger_ui_dir"]

log = logging.getLogger("harness.gateway")

DOCS_PATH = "/docs"
ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "docs.js": "text/javascript",  # ours (the console's folder): starts Swagger UI on /openapi.json
}
"""The files under ``/docs/assets/``; nothing else is served there."""

_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title} - API reference</title>
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"><p>{missing}</p></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/assets/docs.js"></script>
</body>
</html>
"""


def swagger_ui_dir() -> Any | None:
    """The folder of Swagger UI's files (``fastapi_offline/static``), or None if that package
    is missing (an install without the ``gateway`` extra's current dependencies)."""
    try:
        folder = resources.files("fastapi_offline") / "static"
    except ModuleNotFoundError:
        return None
    return folder if (folder / "swagger-ui-bundle.js").is_file() else None


def install_docs(app: FastAPI, console: Any) -> None:
    """``GET /docs`` and ``GET /docs/assets/{name}`` on ``app`` (made with ``docs_url=None``,
    ``redoc_url=None``); ``console``: the folder of the console's files (``docs.js``)."""
    swagger = swagger_ui_dir()
    missing = ""
    if swagger is None:  # the API still serves; the page says what to install
        log.warning("the API reference page /docs has no Swagger UI files: pip install 'durable-harness[gateway]' "
                    "(it needs the fastapi-offline package)")
        missing = ("Swagger UI's files are not installed here: pip install 'durable-harness[gateway]' "
                   "(the fastapi-offline package). The API's OpenAPI document is at /openapi.json.")
    page = _PAGE.format(title=app.title, missing=missing)

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get(DOCS_PATH + "/assets/{name}", include_in_schema=False)
    async def docs_asset(name: Annotated[str, Path(pattern=r"^[a-z-]+\.(js|css)$")]) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, "no such file")
        folder = console if name == "docs.js" else swagger
        if folder is None:
            raise HTTPException(404, "Swagger UI's files are not installed: pip install 'durable-harness[gateway]'")
        return FileResponse(str(folder / name), media_type=ASSETS[name])
