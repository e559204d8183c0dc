"""The environment an engine process starts with."""

from __future__ import annotations

from service.client.engine_launcher import engine_environ


def test_an_engines_malloc_asks_for_huge_pages_beside_the_tunables_given() -> None:
    assert engine_environ({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    given = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert engine_environ(given)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


def test_a_huge_pages_tunable_the_user_set_is_kept() -> None:
    given = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2"}
    assert engine_environ(given) == given
