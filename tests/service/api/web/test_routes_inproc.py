"""The pages' routes in process on the fake engine: what they serve, the policy that keeps them to
this origin, the playground's settings, the vendored scripts' licences, and the API key."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import httpx

from service.api.web.routes import STATIC_DIR

if TYPE_CHECKING:
    from tests.service.conftest import Serve


async def test_the_pages_load_only_their_own_scripts_under_a_policy_that_allows_no_other_origin(
    api: httpx.AsyncClient,
) -> None:
    for path, title in (("/", "zeroserve playground"), ("/dashboard", "zeroserve dashboard")):
        page = await api.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert f"<title>{title}</title>" in page.text
        policy = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
        assert policy["default-src"] == "'none'" and policy["connect-src"] == "'self'"
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
        assert "<script>" not in page.text and " style=" not in page.text
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        local = [asset for asset in assets if asset.startswith("/static/")]
        assert local and set(assets) - set(local) <= {"data:,", "/dashboard", "/"}
        for asset in local:
            response = await api.get(asset)
            assert response.status_code == 200, asset


def test_every_vendored_script_comes_with_its_licence_and_its_origin() -> None:
    vendored = sorted(path for path in (STATIC_DIR / "vendor").iterdir() if path.is_dir())
    assert [path.name for path in vendored] == ["dompurify", "marked"]
    listing = (STATIC_DIR / "vendor" / "README.md").read_text()
    for folder in vendored:
        (script,) = folder.glob("*.js")
        assert (folder / "LICENSE").stat().st_size > 500
        assert f"`{folder.name}/{script.name}`" in listing


async def test_the_playground_starts_from_the_served_models_and_their_generation_defaults(serve: Serve) -> None:
    async with serve(generation_config=(("temperature", 0.6), ("top_k", 20))) as client:
        settings = (await client.get("/playground/settings")).json()
    assert settings["models"] == ["fake", "fake-alias"]
    defaults = settings["defaults"]
    assert (defaults["temperature"], defaults["top_k"], defaults["repetition_penalty"]) == (0.6, 20, 1.0)
    assert (defaults["top_p"], defaults["min_p"], defaults["presence_penalty"]) == (1.0, 0.0, 0.0)
    assert settings["max_model_len"] > 0 and settings["is_stream_kept"] is False


async def test_with_an_api_key_the_pages_open_but_what_they_read_needs_it(serve: Serve) -> None:
    async with serve(api_keys=("k1",)) as client:
        for path in ("/", "/dashboard", "/static/playground.js", "/static/vendor/marked/LICENSE"):
            assert (await client.get(path)).status_code == 200, path
        for path in ("/playground/settings", "/dashboard/events"):
            refused = await client.get(path)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", path
        allowed = await client.get("/playground/settings", headers={"Authorization": "Bearer k1"})
        assert allowed.status_code == 200 and allowed.json()["models"] == ["fake", "fake-alias"]
