"""The request and response models: what ``/docs`` shows and what requests are checked with.

Request bodies are parsed by ``codec`` (strict JSON, or raw bytes) and validated with these
models in pydantic's strict mode: a JSON ``true`` is not the integer 1, ``"3"`` is not 3.
Responses carrying embeddings are serialised by orjson straight from numpy, not through
these models (they only document the shape): FastAPI's encoder measured 200x slower.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max

Int64 = Annotated[int, Field(strict=True, ge=INT64_MIN, le=INT64_MAX)]
# A float a float32 row can hold: a larger one would become inf on the way in.
Float32 = Annotated[float, Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
Offset = Annotated[int, Field(strict=True, ge=0)]
Weight = Annotated[float, Field(allow_inf_nan=False)]
Combiner = Literal["sum", "mean", "sqrtn"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- v1 -------------------------------------------------------------------------------------


class LookupRequest(_Strict):
    """Keys to look up, optionally grouped into bags that are combined into one vector each
    (``Table.lookup``'s arguments)."""

    keys: list[Int64] | list[str] = Field(
        description="Integer keys (int64), or strings for a table whose key type is str."
    )
    offsets: list[Offset] | None = Field(
        default=None,
        description="Start of each bag in keys (torch.nn.EmbeddingBag's convention: "
        "non-decreasing, first 0, no end offset).",
    )
    weights: list[Weight] | None = Field(
        default=None, description="One weight per key (per_sample_weights)."
    )
    combiner: Combiner | None = Field(
        default=None, description="How a bag's rows combine (default with offsets: mean)."
    )
    dtype: Literal["float32", "float16"] | None = Field(
        default=None,
        description="The answer's rows: float32 (default) or float16 (the float32 rows "
        "cast, round to nearest; half the bytes). Also the `dtype` query parameter.",
    )


class IntLookupRequest(LookupRequest):
    keys: list[Int64]


class StrLookupRequest(LookupRequest):
    keys: list[str]


class LookupResponse(BaseModel):
    table: str
    dim: int
    embeddings: list[list[float]] = Field(
        description="One row per key, or one per bag with offsets; a missing key reads its "
        "initializer value."
    )
    found: list[bool] = Field(description="Per key: whether the table has a row for it.")


class SnapshotInfo(BaseModel):
    path: str
    version: str = Field(description="A hash of the snapshot's manifest.")
    step: int
    loaded_at: float = Field(description="Unix time the snapshot was opened.")


class TableInfo(BaseModel):
    name: str
    dim: int
    rows: int
    key_type: Literal["int64", "str"]
    snapshot: str = Field(description="The version of the snapshot serving the table.")


class TablesResponse(BaseModel):
    tables: list[TableInfo]
    snapshot: SnapshotInfo


class TableStats(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    dim: int
    rows: int


class ReloadRequest(_Strict):
    path: str = Field(description="A serving export or database under an --allow-root.")


class ReloadResponse(BaseModel):
    snapshot: SnapshotInfo
    previous: SnapshotInfo | None


class Status(BaseModel):
    status: Literal["ok", "loading", "stale"]


class Error(BaseModel):
    detail: str = Field(description="What was wrong, naming the field and first bad element.")


# -- v2: the Open Inference Protocol (KServe v2), a table being a model ---------------------


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ConfigTensor(BaseModel):
    name: str
    data_type: str = Field(description="Triton's TYPE_* (TYPE_INT64, TYPE_STRING, TYPE_FP32…)")
    dims: list[int] = Field(description="-1: any size (max_batch_size is 0: the whole shape)")


class ModelConfig(BaseModel):
    """Triton's model configuration (``model_config.proto``), as its HTTP API gives it."""

    name: str
    platform: str
    backend: str
    version_policy: dict[str, Any]
    max_batch_size: int
    input: list[ConfigTensor]
    output: list[ConfigTensor]


class RepositoryIndexRequest(_Strict):
    ready: bool | None = Field(default=None, description="Only the models ready to serve.")


class RepositoryModel(BaseModel):
    name: str
    version: str
    state: str = Field(description="READY for every table of the snapshot served")
    reason: str


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


class InferInput(_Strict):
    name: str
    shape: list[Annotated[int, Field(strict=True, ge=0)]]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferRequestedOutput(_Strict):
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(_Strict):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInput]
    outputs: list[InferRequestedOutput] | None = None


class InferOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[InferOutput]


class InferError(BaseModel):
    error: str
