"""How the forms of a model's matmuls are chosen at load: one object, read once from the engine's
`batch_invariant` setting and handed to the loader, the model's prepack and the plans."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MatmulPolicy:
    """Batch-invariant (each weight one row-invariant form at every batch size where it has one, so a row's
    bits never depend on the rows beside it, and a weight a kernel form takes is loaded as the file's blocks
    alone) or fastest (each batch size its fastest form, timed at load; the weights' values kept for torch's
    forms). Unmeasured: every form kept, each weight on its default plan (tests force the form they check)."""

    is_batch_invariant: bool
    is_measured: bool = True

    @classmethod
    def of(cls, batch_invariant: bool) -> MatmulPolicy:
        return BATCH_INVARIANT if batch_invariant else FASTEST


BATCH_INVARIANT = MatmulPolicy(is_batch_invariant=True)
FASTEST = MatmulPolicy(is_batch_invariant=False)
UNMEASURED = MatmulPolicy(is_batch_invariant=False, is_measured=False)
