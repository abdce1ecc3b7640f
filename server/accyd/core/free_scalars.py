"""Free runtime scalars: the ones a prepared launch takes anew, and where their values go.

A runtime scalar is *free* when no check reads its value beyond its dtype's own
(``Pipeline.free_scalars``): no bound, extent, shape, geometry or launch rule names it,
and it reaches the kernels only as a stage's plain argument. Its value then changes
nothing the core decides about a launch, so one prepared launch serves every value of
it, where its backend lets a prepared launch take new values
(``Backend.prepared_takes_scalars``):

- the session's prepared-launch key leaves free scalars out (``core/prepared.py``);
- before each launch the core hands the prepared launch this launch's values
  (``changes``), which apply to the launches enqueued from then on;
- a ring engine's ticket for such a launch matches records whatever their free values,
  and has the prepared launch take each new value the same way (``ring/engine``).

Its dtype's check still applies to every value: an integer of its width always fits; a
float must be finite (the engine sends any other to Python, which refuses it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accyd.backends.base import ScalarChange
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.expr import Arg
from accyd.catalog.model import ArtifactFormat, Pipeline, Registry

__all__ = ["FreeScalar", "FreeScalars", "free_scalars_of"]


@dataclass(frozen=True, slots=True)
class FreeScalar:
    """One free runtime scalar: its index, its dtype, and the (stage, position) of each
    stage argument that passes it through."""

    index: int
    dtype: DType
    places: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class FreeScalars:
    """A pipeline's free runtime scalars (at least one), in index order."""

    scalars: tuple[FreeScalar, ...]
    indices: frozenset[int]

    def changes(self, args: Sequence[Scalar] | Mapping[int, Scalar]) -> list[ScalarChange]:
        """What a prepared launch takes for a launch with runtime scalars ``args`` (by index:
        the free ones are enough)."""
        return [
            (stage, position, args[free.index])
            for free in self.scalars
            for stage, position in free.places
        ]


def free_scalars_of(
    pipeline: Pipeline, registry: Registry, format: ArtifactFormat
) -> FreeScalars | None:
    """``pipeline``'s free runtime scalars for ``format``, or ``None`` when it has none."""
    indices = sorted(pipeline.free_scalars(registry, format))
    if not indices:
        return None
    found = []
    for index in indices:
        places = tuple(
            (stage_index, position)
            for stage_index, stage in enumerate(pipeline.stages)
            for position, expr in enumerate(stage.scalars)
            if isinstance(expr, Arg) and expr.index == index
        )
        found.append(FreeScalar(index, pipeline.runtime_scalars[index].dtype, places))
    return FreeScalars(tuple(found), frozenset(indices))
