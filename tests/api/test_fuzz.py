"""Property tests: schemathesis against the app's own OpenAPI spec, raw-body fuzzing, and an
attacker's corpus sent to every route.

Whatever arrives, the answer is a 2xx or a 4xx with a JSON message, never a 5xx, and what
the spec promises about status codes, content types and response bodies holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evdb.api import Settings, create_app

from .conftest import build_snapshot, loaded_app

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def fuzz_settings(tmp_path_factory) -> Settings:
    root = tmp_path_factory.mktemp("fuzz")
    path = build_snapshot(root, "snap", 1.0, n=50)
    return Settings(path=path, token="t", allow_roots=(root,), max_keys=64)


@pytest.fixture(scope="module")
def app(fuzz_settings):
    app = loaded_app(fuzz_settings)
    yield app
    app.state.holder.close()


@pytest.fixture(scope="module")
def client(app):
    from fastapi.testclient import TestClient

    return TestClient(app)  # no lifespan: the snapshot is loaded already


def _operations() -> list[str]:
    """Every operation of the spec (the spec does not depend on the snapshot)."""
    spec = schemathesis.openapi.from_asgi("/openapi.json", create_app(Settings()))
    return [result.ok().label for result in spec.get_all_operations()]


@pytest.mark.parametrize("label", _operations())
def test_every_operation_keeps_its_spec(fuzz_settings, label) -> None:
    app = create_app(fuzz_settings)  # its own: schemathesis runs the lifespan, which closes
    operation = schemathesis.openapi.from_asgi("/openapi.json", app).find_operation_by_label(label)
    # positive_data_acceptance is off: a schema-valid body can still break a rule the schema
    # cannot say (offsets non-decreasing, a key type that depends on the table), and gets 422.
    from schemathesis.checks import positive_data_acceptance

    @given(case=operation.as_strategy(), table=st.sampled_from(["item", "tok", None]))
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case, table) -> None:
        # Mostly name a real table: the spec cannot list them, and a random name is a 404.
        for param in ("name", "model"):
            if table is not None and param in (case.path_parameters or {}):
                case.path_parameters[param] = table
        case.call_and_validate(excluded_checks=[positive_data_acceptance])

    check()


JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "keys": JSONISH,
        "offsets": JSONISH,
        "weights": JSONISH,
        "combiner": JSONISH,
        "inputs": JSONISH,
        "outputs": JSONISH,
        "parameters": JSONISH,
    },
)


def _refused_cleanly(r, key: str) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {key} and isinstance(body[key], str) and body[key], body


@given(raw=st.binary(max_size=200) | FIELDS.map(lambda d: json.dumps(d).encode()))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.parametrize("table", ["item", "tok"])
@pytest.mark.parametrize("kind", ["application/json", "application/octet-stream", "text/csv"])
def test_lookup_raw_bodies_never_5xx(client, table, kind, raw) -> None:
    r = client.post(f"/v1/tables/{table}/lookup", content=raw, headers={"content-type": kind})
    _refused_cleanly(r, "detail")
    if r.status_code == 200 and kind == "application/octet-stream":
        n = len(raw) // 8
        assert len(r.json()["found"]) == n


@given(
    raw=st.binary(max_size=200) | FIELDS.map(lambda d: json.dumps(d).encode()),
    cut=st.none() | st.integers(-3, 250).map(str) | st.text(max_size=4),
)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.parametrize("table", ["item", "tok"])
def test_infer_raw_bodies_never_5xx(client, table, raw, cut) -> None:
    headers = {} if cut is None else {"Inference-Header-Content-Length": cut}
    try:
        r = client.post(f"/v2/models/{table}/infer", content=raw, headers=headers)
    except UnicodeEncodeError:  # a header httpx itself cannot send
        return
    _refused_cleanly(r, "error")


@given(
    keys=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=70),
    data=st.data(),
)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_valid_lookups_match_the_table(app, client, keys, data) -> None:
    """Any keys, any valid bags: the answer is Table.lookup's, bit for bit."""
    n = len(keys)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=5)))
    offsets = [0, *cuts] if n else []
    combiner = data.draw(st.sampled_from(["sum", "mean", "sqrtn"]))
    req = {"keys": keys, "offsets": offsets, "combiner": combiner} if offsets else {"keys": keys}
    r = client.post("/v1/tables/item/lookup", json=req)
    if n > 64:
        assert r.status_code == 413
        return
    assert r.status_code == 200, r.text
    table = app.state.holder.current.tables["item"]
    want = table.lookup(keys, offsets or None, None, combiner if offsets else None)
    got = np.array(r.json()["embeddings"], np.float32).reshape(want.shape)
    np.testing.assert_array_equal(got, want)
    assert r.json()["found"] == table.contains(keys).tolist()


# -- an attacker's corpus over every route --------------------------------------------------
#
# Hypothesis above draws bodies at random; this sends, to every route of the app, the inputs
# that break servers: each field of a valid body replaced by an odd value (non-JSON numbers,
# numbers past float64 and int64, -0, wrong types, strings with NUL or a lone surrogate,
# nesting deeper than any recursion limit), whole bodies that are not JSON or not an object,
# every content type, odd path parameters and query strings, wrong methods. Deterministic, so
# its count of requests is a figure that can be compared from run to run.


def _deep(open_: bytes, close: bytes, depth: int, leaf: bytes = b"1") -> bytes:
    return open_ * depth + leaf + close * depth


ODD_VALUES: list[bytes] = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"-0",
    b"-0.0",
    b"1.5",
    str(2**63).encode(),
    str(2**64).encode(),
    str(-(2**63) - 1).encode(),
    str(-(2**64)).encode(),
    b"9" * 400,
    b"true",
    b"null",
    b'""',
    b'"\\u0000"',
    b'"a\\u0000b"',
    b'"\\ud800"',
    b'"' + b"x" * 5000 + b'"',
    b"[]",
    b"{}",
    b'{"a": 1}',
    b"[NaN]",
    b"[1e400, -0, 1.5]",
    b"[" + str(2**64).encode() + b"]",
    b'[null, true, "x", {}, []]',
    b"[[1], [2, 3]]",
    _deep(b"[", b"]", 1000),
    _deep(b"[", b"]", 5000),
    _deep(b'{"a":', b"}", 1000),
    b"[" + _deep(b"[", b"]", 1000) + b"]",
]
# Valid bodies per route kind, and the fields (dotted paths into them) whose value is replaced.
VALID_BODIES: dict[str, tuple[dict[str, Any], str]] = {
    "lookup": (
        {"keys": [1, 2, 3], "offsets": [0, 1], "weights": [1.0, 2.0, 3.0], "combiner": "sum"},
        "keys keys.0 offsets offsets.1 weights weights.0 combiner",
    ),
    "neighbors": ({"key": 1, "k": 3, "metric": "cosine"}, "key k metric vector"),
    "infer": (
        {
            "id": "1",
            "parameters": {"binary_data_output": False},
            "inputs": [{"name": "keys", "datatype": "INT64", "shape": [2, 1], "data": [[1], [2]]}],
            "outputs": [{"name": "embeddings", "parameters": {"binary_data": False}}],
        },
        "id parameters parameters.binary_data_output inputs inputs.0 inputs.0.name "
        "inputs.0.datatype inputs.0.shape inputs.0.shape.0 inputs.0.data inputs.0.data.0 "
        "inputs.0.data.0.0 inputs.0.parameters inputs.0.parameters.binary_data_size outputs "
        "outputs.0.name outputs.0.parameters.binary_data",
    ),
}
WHOLE_BODIES: list[bytes] = [
    b"",
    b"{",
    b"}",
    b"null",
    b"[]",
    b'"keys"',
    b"NaN",
    b"1e400",
    b"\xff\xfe\x00",
    b"\xef\xbb\xbf{}",
    b'{"keys": [1]} trailing',
    b'{"keys": [1], "keys": "x"}',
    _deep(b"[", b"]", 1000),
    _deep(b'{"a":', b"}", 1000),
    _deep(b"[", b"]", 100_000),
    b"\x00" * 64,
]
CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=latin-1",
    "APPLICATION/JSON",
    "application/octet-stream",
    "text/plain",
    "text/plain; charset=utf-8",
    "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded",
    "application/vnd.evil+json",
    "*/*",
    ";",
    "",
]
PATH_VALUES = ["item", "tok", "nope", "..", "%00", "%2e%2e", "%2F", "%ff", "é", "%F0%9F%98%80",
               "a" * 5000, "item%00", "NaN", "-0", str(2**64)]  # fmt: skip
QUERIES = ["", "?a=1", "?%00=%00", "?" + "x" * 8000, "?keys=1&keys=2", "?=&&=", "?%ff"]
RELOAD_PATHS = ["a\x00b", "\x00", "", "/", "..", "~", "a" * 5000, "/" + "a" * 300, "snap",
                "\ud800", "\n", "/dev/null", "/proc/self/mem", "file", "nope", "loop",
                "snap/../snap", "snap/MANIFEST.json", "snap\\..\\snap"]  # fmt: skip
ADMIN_HEADERS = [
    {"authorization": "Bearer t"},
    {"authorization": "Bearer"},
    {"authorization": "Bearer " + "x" * 10000},
    {"authorization": "Basic dDp0"},
    {"authorization": "Bearer t\t"},
]


def _spliced(body: Any, at: str, raw: bytes) -> bytes:
    """``body`` as JSON with the value at dotted path ``at`` (added if missing) replaced by
    ``raw`` bytes, which need not be JSON: NaN, 1e400, a nesting deeper than json.dumps goes."""
    marker = "\x01SPLICE\x01"
    body = json.loads(json.dumps(body))  # a copy
    node = body
    *parents, last = [int(p) if p.isdigit() else p for p in at.split(".")]
    for part in parents:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[last] = marker
    return json.dumps(body).encode().replace(json.dumps(marker).encode(), raw, 1)


def _attacks(root: Path) -> Iterator[tuple[str, str, bytes, dict[str, str]]]:
    """(method, url, body, headers) of every attack, over every route of the app."""
    admin = {"authorization": "Bearer t"}
    # each field of a valid body replaced by each odd value (the versioned infer route
    # shares the handler: the whole-body attacks below reach it)
    urls = {"lookup": "/v1/tables/{}/lookup", "neighbors": "/v1/tables/{}/neighbors",
            "infer": "/v2/models/{}/infer"}  # fmt: skip
    for kind, url in urls.items():
        good, fields = VALID_BODIES[kind]
        for table in ("item", "tok"):
            for at in fields.split():
                for raw in ODD_VALUES:
                    yield "POST", url.format(table), _spliced(good, at, raw), {}
    for raw in ODD_VALUES:
        yield "POST", "/v1/admin/reload", _spliced({}, "path", raw), admin
    for p in RELOAD_PATHS:
        path = p if p.startswith(("/", "\x00", "\ud800")) or not p else f"{root}/{p}"
        raw = json.dumps({"path": path}).encode()
        yield "POST", "/v1/admin/reload", raw, admin
    # whole bodies, under every content type, to every route that takes a body
    posts = ["/v1/tables/item/lookup", "/v1/tables/tok/lookup", "/v1/tables/item/neighbors",
             "/v2/models/item/infer", "/v2/models/tok/infer", "/v1/admin/reload"]  # fmt: skip
    valid = {
        "/v1/tables/item/lookup": b'{"keys": [1]}',
        "/v1/tables/tok/lookup": b'{"keys": ["the"]}',
        "/v1/tables/item/neighbors": b'{"key": 1}',
        "/v2/models/item/infer": json.dumps(VALID_BODIES["infer"][0]).encode(),
        "/v2/models/tok/infer": b'{"inputs": [{"name": "keys", "datatype": "BYTES", '
        b'"shape": [1], "data": ["the"]}]}',
        "/v1/admin/reload": json.dumps({"path": f"{root}/snap"}).encode(),
    }
    for url in posts:
        headers = admin if "admin" in url else {}
        for ctype in CONTENT_TYPES:
            ct = {} if ctype is None else {"content-type": ctype}
            for raw in [valid[url], *WHOLE_BODIES]:
                yield "POST", url, raw, {**headers, **ct}
        for extra in ADMIN_HEADERS if "admin" in url else []:
            yield "POST", url, valid[url], extra
        for encoding in ("gzip", "deflate", "br", "gzip, gzip", ""):
            yield "POST", url, valid[url], {**headers, "content-encoding": encoding}
        for cut in ("0", "1", "-1", "99999999999999999999", "1e3", " 1"):
            yield "POST", url, valid[url], {**headers, "inference-header-content-length": cut}
        for accept in ("application/octet-stream", "*/*", "text/html", "application/json;q=0"):
            yield "POST", url, valid[url], {**headers, "accept": accept}
    # every route, with odd path parameters and query strings, by its own and other methods
    # (each odd path value once, each odd query string once: their product adds nothing)
    for template, methods in _routes():
        names = PATH_VALUES if "{" in template else [""]
        odd = [(name, "") for name in names] + [(names[0], query) for query in QUERIES[1:]]
        for i, (name, query) in enumerate(odd):
            url = re.sub(r"\{[^}]+\}", name, template)
            for method in [*methods, "PUT", "DELETE", *(("HEAD", "OPTIONS", "PATCH") * (i == 0))]:
                headers = admin if "admin" in url else {}
                body = valid.get(url, b"{}") if method == "POST" else b""
                yield method, url + query, body, headers


def _routes() -> list[tuple[str, list[str]]]:
    app = create_app(Settings())
    out = []
    for route in app.routes:
        path = getattr(route, "path", None)
        methods = sorted((getattr(route, "methods", None) or {"GET"}) - {"HEAD"})
        if path is not None:
            out.append((path, methods))
    return out


def test_every_route_refuses_an_attackers_corpus_without_5xx(fuzz_settings) -> None:
    """The whole corpus, every route: no answer is a 5xx, and every refusal is a 4xx whose
    JSON names what was wrong (issue 26: a deep ``data`` and a NUL in a reload path gave
    500)."""
    from fastapi.testclient import TestClient

    root = fuzz_settings.allow_roots[0]
    (root / "file").write_bytes(b"not a database")
    (root / "loop").symlink_to(root / "loop")
    app = loaded_app(fuzz_settings)
    sent = 0
    failed: list[str] = []
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: loaded already
    for method, url, body, headers in _attacks(root):
        try:
            r = client.request(method, url, content=body, headers=headers)
        except (UnicodeEncodeError, httpx.InvalidURL):  # what httpx itself cannot send
            continue
        sent += 1
        if r.status_code >= 500:
            failed.append(f"{r.status_code} {method} {url[:80]} {body[-120:]!r} {headers}")
    app.state.holder.close()
    print(f"attack corpus: {sent} requests, {len(failed)} 5xx")
    assert not failed, f"{len(failed)} of {sent} requests answered 5xx:\n" + "\n".join(failed[:40])
