"""The README's "How it works" names every room of the tree: a package added under engine_proc/ or service/
without a word there fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _layout_item(top: str) -> str:
    """The item of "How it works" that describes the package `top` ("- `service/`: ...")."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## How it works") :]
    item = section[section.index(f"\n- `{top}/`") + 1 :]
    return item[: item.index("\n- ")]


@pytest.mark.parametrize("top", ["engine_proc", "service"])
def test_how_it_works_names_every_room(top: str) -> None:
    rooms = sorted(path.parent.name for path in (ROOT / top).glob("*/__init__.py"))
    assert rooms
    item = _layout_item(top)
    assert [room for room in rooms if f"`{room}/`" not in item] == []
