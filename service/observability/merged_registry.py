"""One /metrics for several models' registries: each family once, with every model's series (their
`model_name` labels tell them apart)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator

from prometheus_client import CollectorRegistry, Metric


class MergedRegistry:
    """What `generate_latest` reads: the families of the registries `registries()` gives now, merged by name,
    but those named in `skip` (`extra` has them for the whole)."""

    def __init__(
        self, registries: Callable[[], Iterable[CollectorRegistry]], extra: Iterable[Metric] = (),
        skip: Collection[str] = (),
    ) -> None:
        self._registries = registries
        self._extra = list(extra)
        self._skip = frozenset(skip)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self._registries():
            for family in registry.collect():
                if family.name in self._skip:
                    continue
                known = merged.get(family.name)
                if known is None:
                    merged[family.name] = family
                else:
                    known.samples.extend(family.samples)
        yield from merged.values()
        yield from self._extra
