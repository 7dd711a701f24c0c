"""What every config section shares: its pydantic settings and the constrained number types.

gem.config (the pipeline's settings) and gem.model.configs (the architectures') both build on these,
so a bound is declared once, on the field, and its error names the field and the value.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

# Frozen sections that refuse unknown keys; numbers given for a text field (a YAML `driver_memory: 4096`)
# become text.
SECTION = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]
# A sampling rate: in (0, 1].
Rate = Annotated[float, Field(gt=0.0, le=1.0)]
# A share that may be 0: in [0, 1].
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
