"""The check every route test makes of an error answer: OpenAI's shape, its status and the parameter it names."""

from __future__ import annotations

from typing import Any

import httpx


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    assert error["param"] == param
    return error
