"""Requests an attacker sends (issue 26, item 9): each is refused with a 4xx that names what
was wrong, never a 500, and every response tells the browser not to sniff its type."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import TOKEN

AUTH = {"authorization": f"Bearer {TOKEN}"}
INT_INPUT = {"name": "keys", "datatype": "INT64"}


def _infer_nested(client, depth: int, shape: list[int]):
    """Infer of key 5 as ``data`` nested ``depth`` lists deep (written by hand: json.dumps
    itself recurses)."""
    head = json.dumps({"inputs": [{**INT_INPUT, "shape": shape, "data": "DATA"}]})
    data = "[" * depth + "5" + "]" * depth
    body = head.replace('"DATA"', data).encode()
    return client.post("/v2/models/item/infer", content=body)


def test_infer_data_nested_1000_deep_is_a_422_not_a_recursion_error(client) -> None:
    """The codec walked nested data by recursion: 1,000 levels raised RecursionError (500)."""
    r = _infer_nested(client, 1000, [1])
    assert r.status_code == 422, r.text
    assert r.json() == {"error": "inputs[0].data: nested more than 64 lists deep"}


def test_infer_data_nested_as_deep_as_numpy_allows_is_served(client, reference) -> None:
    r = _infer_nested(client, 64, [1] * 64)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [1] * 64 + [4]
    np.testing.assert_array_equal(
        np.array(out["data"], np.float32), reference.table("item").lookup([5])[0]
    )


def _reload(client, path: str):
    return client.post("/v1/admin/reload", json={"path": path}, headers=AUTH)


def test_reload_path_with_a_nul_byte_is_a_422_naming_path(client, snapshots) -> None:
    """A NUL byte reached the filesystem calls: ValueError (embedded null byte), a 500."""
    path = f"{snapshots[0]}\x00/etc"
    r = _reload(client, path)
    assert r.status_code == 422, r.text
    assert r.json() == {"detail": f"path: a NUL byte at character {len(str(snapshots[0]))}"}


def test_reload_of_a_symlink_loop_is_a_422_naming_path(client, snapshots) -> None:
    loop = snapshots[0].parent / "loop"
    loop.unlink(missing_ok=True)
    loop.symlink_to(loop)
    try:
        r = _reload(client, str(loop / "x"))
    finally:
        loop.unlink()
    assert r.status_code == 422, r.text  # resolve() raises on a loop before Python 3.13
    assert r.json()["detail"].startswith(("path: cannot be resolved", "path: cannot be served"))


def test_reload_of_a_name_too_long_for_the_filesystem_is_a_422(client, snapshots) -> None:
    """evdb.open's OSError (ENAMETOOLONG) was not an EvdbError: a 500."""
    r = _reload(client, str(snapshots[0].parent / ("a" * 300)))
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("path: cannot be served (OSError")


def test_reload_of_an_empty_path_is_a_422(client) -> None:
    r = _reload(client, "")
    assert r.status_code == 422 and r.json() == {"detail": "path: empty"}


def test_a_reload_refused_for_its_path_changes_nothing(client, snapshots) -> None:
    before = client.get("/v1/tables").json()["snapshot"]
    for path in (f"{snapshots[1]}\x00", "", str(Path(snapshots[1]) / ("b" * 300))):
        assert _reload(client, path).status_code == 422
    assert client.get("/v1/tables").json()["snapshot"] == before


def test_a_neighbors_vector_outside_float32_is_a_422_naming_it(client) -> None:
    """1.7e308 is a finite JSON number but inf as float32: the answer was a 200 whose scores
    were all null."""
    r = client.post("/v1/tables/item/neighbors", json={"vector": [1, 2, 1.7e308, 3]})
    assert r.status_code == 422, r.text
    assert r.json() == {"detail": "vector[2]: number outside float32"}


def test_neighbors_scores_that_overflow_float32_are_a_422_not_nulls(client) -> None:
    """A row's dot product with 3e38 overflows float32: the scores were inf, written as null
    in a 200."""
    r = client.post("/v1/tables/item/neighbors", json={"vector": [3e38, 0, 0, 0], "metric": "dot"})
    assert r.status_code == 422, r.text
    assert r.json() == {"detail": "vector: its dot scores overflow float32 (values too large)"}


# Every route that reads a JSON body, with a body it serves (reload's is made per test).
JSON_ROUTES = {
    "lookup": ("/v1/tables/item/lookup", {"keys": [5]}, {}),
    "neighbors": ("/v1/tables/item/neighbors", {"key": 5, "k": 2}, {}),
    "infer": ("/v2/models/item/infer", {"inputs": [{**INT_INPUT, "shape": [1], "data": [5]}]}, {}),
    "reload": ("/v1/admin/reload", None, AUTH),
}


def _route(name: str, snapshots) -> tuple[str, bytes, dict[str, str]]:
    url, body, headers = JSON_ROUTES[name]
    body = {"path": str(snapshots[0])} if body is None else body
    return url, json.dumps(body).encode(), headers


@pytest.mark.parametrize("route", sorted(JSON_ROUTES))
@pytest.mark.parametrize(
    "kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""]
)
def test_every_json_body_route_refuses_other_content_types_with_415(
    client, snapshots, route, kind
) -> None:
    """Neighbours, infer and reload read a text/plain body as JSON (lookup answered 415): a
    browser's simple cross-site POST, which needs no CORS preflight, reached them."""
    url, body, headers = _route(route, snapshots)
    r = client.post(url, content=body, headers={**headers, "content-type": kind})
    assert r.status_code == 415, r.text
    key = "error" if url.startswith("/v2") else "detail"
    assert r.json()[key].startswith("content-type: expected application/json"), r.text


@pytest.mark.parametrize("route", sorted(JSON_ROUTES))
@pytest.mark.parametrize("kind", [None, "application/json", "application/json; charset=utf-8"])
def test_every_json_body_route_takes_json_with_or_without_a_content_type(
    client, snapshots, route, kind
) -> None:
    url, body, headers = _route(route, snapshots)
    ct = {} if kind is None else {"content-type": kind}
    r = client.post(url, content=body, headers={**headers, **ct})
    assert r.status_code == 200, r.text


def test_infer_takes_an_octet_stream_body_for_the_binary_extension(client, reference) -> None:
    """aiohttp (tritonclient.http.aio) labels a binary infer body application/octet-stream."""
    keys = np.array([5, -1000], dtype="<i8")
    head = {"inputs": [{**INT_INPUT, "shape": [2], "parameters": {"binary_data_size": 16}}]}
    header = json.dumps(head).encode()
    r = client.post(
        "/v2/models/item/infer",
        content=header + keys.tobytes(),
        headers={
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(header)),
        },
    )
    assert r.status_code == 200, r.text
    got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(2, 4)
    np.testing.assert_array_equal(got, reference.table("item").lookup(keys))


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/healthz"),
        ("GET", "/v1/tables"),
        ("GET", "/v1/tables/item"),
        ("POST", "/v1/tables/item/lookup"),  # 422: no body
        ("GET", "/v1/tables/nope"),  # 404
        ("GET", "/no/such/route"),  # 404 from the router
        ("DELETE", "/healthz"),  # 405
        ("POST", "/v1/admin/reload"),  # 401
        ("GET", "/v2"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/favicon.ico"),
        ("GET", "/dashboard"),
        ("GET", "/dashboard/static/dashboard.js"),
        ("GET", "/dashboard/static/uPlot.min.css"),
        ("GET", "/v1/dashboard/summary"),
    ],
)
def test_every_response_says_nosniff_once(client, method, url) -> None:
    """JSON answers carried no X-Content-Type-Options (only the dashboard's and docs' pages
    did): a browser could sniff a JSON error quoting a client's string as HTML."""
    r = client.request(method, url)
    assert r.headers.get_list("x-content-type-options") == ["nosniff"], (r.status_code, url)
