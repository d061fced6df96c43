"""Property tests: schemathesis against the app's own OpenAPI spec, and raw-body fuzzing.

Whatever arrives, the answer is a 2xx or a 4xx with a JSON message, never a 5xx, and what
the spec promises about status codes, content types and response bodies holds.
"""

from __future__ import annotations

import json

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
