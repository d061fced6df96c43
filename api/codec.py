"""Request bodies in, response bodies out: strict JSON, raw bytes, and KServe v2 tensors.

JSON is parsed by orjson, which follows RFC 8259 strictly (``NaN``, ``Infinity`` and other
non-JSON tokens are errors), and written by orjson straight from numpy arrays. Every error is
an :class:`ApiError` whose message names the field and the first bad element, and never
echoes the request's raw input back.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, StrictStr, TypeAdapter, ValidationError
from starlette.requests import Request

from .schemas import FLOAT32_MAX, INT64_MAX, Int64

JSON = "application/json"
OCTET = "application/octet-stream"
SHAPE_HEADER = "X-Evdb-Shape"
FOUND_HEADER = "X-Evdb-Found"
INFER_HEADER = "Inference-Header-Content-Length"

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """A request the service refuses: an HTTP status and a message for the client."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def short(name: str, limit: int = 64) -> str:
    """A client-supplied name fit to quote in a message (bounded, repr-escaped)."""
    return repr(name if len(name) <= limit else name[:limit] + "...")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit`` bytes (so a huge
    body is never buffered whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body: {declared} bytes is more than the limit of {limit}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body: more than the limit of {limit} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "identity":
        return body
    return _inflate(body, encoding, limit)


# zlib's wbits per Content-Encoding: gzip framing, or zlib framing ("deflate" in HTTP)
_WBITS = {"gzip": 31, "deflate": 15}


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed body (tritonclient's request_compression_algorithm), inflated no further
    than ``limit`` bytes, so a small bomb cannot grow into a huge buffer."""
    if encoding not in _WBITS:
        raise ApiError(415, f"content-encoding: expected gzip, deflate or identity, got "
                       f"{short(encoding)}")  # fmt: skip
    inflater = zlib.decompressobj(wbits=_WBITS[encoding])
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as e:
        raise ApiError(422, f"body: not valid {encoding} data ({e})") from None
    if len(out) > limit:
        raise ApiError(413, f"body: inflates to more than the limit of {limit} bytes")
    if not inflater.eof:
        raise ApiError(422, f"body: {encoding} data ends early")
    return out


def media_type(request: Request) -> str:
    return request.headers.get("content-type", JSON).split(";")[0].strip().lower()


def body_type(request: Request, *accepted: str) -> str:
    """The body's media type if it is one of ``accepted``, else 415: the one rule of every
    route that reads a body (a body without a Content-Type is JSON; ``text/plain``, forms and
    the rest are refused, so a browser's simple cross-site POST is never read as JSON)."""
    kind = media_type(request)
    if kind not in accepted:
        raise ApiError(415, f"content-type: expected {' or '.join(accepted)}, got {short(kind)}")
    return kind


def wants_octet(request: Request) -> bool:
    return OCTET in request.headers.get("accept", "")


def parse_json(body: bytes, what: str = "body") -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ApiError(422, f"{what}: not valid JSON ({e})") from None


def location(loc: Sequence[int | str]) -> str:
    """('keys', 3) -> 'keys[3]'; ('inputs', 0, 'shape') -> 'inputs[0].shape'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validation_message(error: ValidationError | Sequence[Any]) -> str:
    """The first error, as 'field[i]: what is wrong' (the bad input itself is not quoted)."""
    errors = error.errors() if isinstance(error, ValidationError) else error
    first = errors[0]
    msg = str(first.get("msg", "invalid"))
    bad = first.get("input")
    if first.get("type") == "int_type" and isinstance(bad, float) and abs(bad) > INT64_MAX:
        msg = "integer outside int64"  # orjson reads integers past 2**64 as floats
    elif first.get("type") in ("greater_than_equal", "less_than_equal") and isinstance(bad, int):
        msg += " (outside int64)" if abs(bad) > INT64_MAX else ""
    elif first.get("type") in ("greater_than_equal", "less_than_equal") and isinstance(bad, float):
        msg = "number outside float32" if abs(bad) > FLOAT32_MAX else msg
    return f"{location(first.get('loc', ()))}: {msg}"


def validate(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise ApiError(422, f"body: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ApiError(422, validation_message(e)) from None


def int64_keys(body: bytes) -> np.ndarray:
    """An ``application/octet-stream`` body: little-endian int64 keys, 8 bytes each."""
    if len(body) % 8:
        raise ApiError(
            422, f"body: {len(body)} bytes is not a whole number of int64 keys (8 bytes each)"
        )
    return np.frombuffer(body, dtype="<i8")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


# -- KServe v2 tensors ----------------------------------------------------------------------

# The Open Inference Protocol's datatypes of the one input and two outputs a table has.
DATATYPES: dict[str, np.dtype[Any]] = {
    "INT64": np.dtype("<i8"),
    "FP32": np.dtype("<f4"),
    "FP16": np.dtype("<f2"),  # embeddings asked for in half precision
    "BOOL": np.dtype(np.bool_),
}


def split_infer_body(body: bytes, header_length: str | None) -> tuple[Any, bytes]:
    """The JSON part of an infer request and the binary data after it (binary tensor data
    extension: ``Inference-Header-Content-Length`` says where the JSON ends)."""
    if header_length is None:
        return parse_json(body), b""
    if not header_length.isdigit() or int(header_length) > len(body):
        raise ApiError(
            422,
            f"{INFER_HEADER}: expected a byte count of at most the body's {len(body)} bytes",
        )
    n = int(header_length)
    return parse_json(body[:n], "body (JSON header)"), body[n:]


def tensor_size(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def decode_keys(
    inputs: Sequence[Any], binary: bytes, key_type: str
) -> tuple[np.ndarray | list[str], list[int]]:
    """The ``keys`` input of an infer request (the only input a table takes): int64 keys, or
    strings (``BYTES``) for a str table; returns them flat, with the input's shape."""
    if len(inputs) != 1 or inputs[0].name != "keys":
        names = [i.name for i in inputs]
        raise ApiError(422, f"inputs: expected exactly one input named 'keys', got {names!r}")
    tensor = inputs[0]
    want = "INT64" if key_type == "int64" else "BYTES"
    if tensor.datatype != want:
        raise ApiError(
            422, f"inputs[0].datatype: this table's keys are {want}, got {tensor.datatype!r}"
        )
    n = tensor_size(tensor.shape)
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is not None:
        if tensor.data is not None:
            raise ApiError(422, "inputs[0]: both data and binary_data_size are given")
        if not isinstance(size, int) or isinstance(size, bool) or size != len(binary):
            raise ApiError(
                422,
                f"inputs[0].parameters.binary_data_size: expected {len(binary)} (the bytes "
                "after the JSON header)",
            )
        if want == "BYTES":
            return _decode_bytes(binary, n), list(tensor.shape)
        if size != 8 * n:
            raise ApiError(
                422, f"inputs[0].parameters.binary_data_size: shape {tensor.shape} needs {8 * n}"
            )
        return np.frombuffer(binary, dtype="<i8"), list(tensor.shape)
    if binary:
        raise ApiError(422, "body: binary data follows the JSON but no input claims it")
    if tensor.data is None:
        raise ApiError(422, "inputs[0].data: missing (and no binary_data_size)")
    flat = _flatten(tensor.data)
    if len(flat) != n:
        raise ApiError(
            422, f"inputs[0].data: {len(flat)} elements do not fill shape {tensor.shape}"
        )
    adapter = _STR_LIST if want == "BYTES" else _INT64_LIST
    try:
        keys: list[Any] = adapter.validate_python(flat)
    except ValidationError as e:
        raise ApiError(422, "inputs[0].data" + validation_message(e)) from None
    if want == "BYTES":
        return keys, list(tensor.shape)
    return np.array(keys, dtype=np.int64), list(tensor.shape)


_INT64_LIST = TypeAdapter(list[Int64])
_STR_LIST = TypeAdapter(list[StrictStr])


# The deepest nesting of a tensor's data: numpy's most dimensions. A client's nesting is
# walked with a stack, not recursion: data nested 1,000 deep exhausted Python's recursion
# limit (a RecursionError, answered 500).
MAX_NESTING = 64


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major flattening of nested lists (the protocol allows either form)."""
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                if len(stack) == MAX_NESTING:
                    raise ApiError(
                        422, f"inputs[0].data: nested more than {MAX_NESTING} lists deep"
                    )
                stack.append(iter(x))
                break
            out.append(x)
        else:  # this list is done: back to its parent
            stack.pop()
    return out


def _decode_bytes(binary: bytes, n: int) -> list[str]:
    """BYTES binary data: each element a 4-byte little-endian length, then its bytes."""
    out = []
    at = 0
    for i in range(n):
        if at + 4 > len(binary):
            raise ApiError(422, f"inputs[0]: binary data ends before element {i}")
        size = int.from_bytes(binary[at : at + 4], "little")
        at += 4
        try:
            out.append(binary[at : at + size].decode())
        except UnicodeDecodeError:
            raise ApiError(422, f"inputs[0]: element {i} is not UTF-8") from None
        at += size
    if at != len(binary):
        raise ApiError(422, f"inputs[0]: {len(binary) - at} bytes left after {n} elements")
    return out


def wanted_outputs(request: Any) -> dict[str, bool]:
    """Output name -> binary? (all outputs when none is named; binary when asked for, per
    output or by the request's ``binary_data_output``)."""
    default = bool((request.parameters or {}).get("binary_data_output", False))
    if not request.outputs:
        return {"embeddings": default, "found": default}
    out = {}
    for i, o in enumerate(request.outputs):
        if o.name not in ("embeddings", "found"):
            raise ApiError(
                422,
                f"outputs[{i}].name: unknown output {short(o.name)}; expected embeddings or found",
            )
        out[o.name] = bool((o.parameters or {}).get("binary_data", default))
    return out


def encode_outputs(
    tensors: dict[str, tuple[np.ndarray, list[int], str]], binary: dict[str, bool]
) -> tuple[list[dict[str, Any]], bytes]:
    """The response's output entries, and the binary data to append after the JSON."""
    entries = []
    blobs = []
    for name, is_binary in binary.items():
        array, shape, datatype = tensors[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if is_binary:
            raw = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.reshape(-1)
        entries.append(entry)
    return entries, b"".join(blobs)
