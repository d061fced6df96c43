"""Array aliases used in annotations across evdb (one place, like numbagg's ``FloatArray``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
AnyArray = npt.NDArray[Any]
