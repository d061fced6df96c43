"""evdb.torch: the modules train like torch.nn.EmbeddingBag, and follow its conventions."""

from __future__ import annotations

import numpy as np
import pytest

import evdb

torch = pytest.importorskip("torch")
from evdb.torch import EmbeddingBag, EmbeddingBagCollection  # noqa: E402

VOCAB, DIM, BATCH, STEPS = 40, 6, 16, 50


class Model(torch.nn.Module):
    """Two categorical features -> embeddings -> MLP -> logit (a tiny DLRM)."""

    def __init__(self, user: torch.nn.Module, item: torch.nn.Module) -> None:
        super().__init__()
        self.user, self.item = user, item
        torch.manual_seed(0)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(2 * DIM, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )

    def forward(self, u, uo, i, io):
        return self.mlp(torch.cat([self.user(u, uo), self.item(i, io)], dim=1)).squeeze(1)


def batches():
    rng = np.random.default_rng(3)
    for _ in range(STEPS):
        lens = rng.integers(1, 4, BATCH)
        u = torch.from_numpy(rng.integers(0, VOCAB, BATCH))
        uo = torch.arange(BATCH)
        i = torch.from_numpy(rng.integers(0, VOCAB, int(lens.sum())))
        io = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]]))
        y = torch.from_numpy(rng.integers(0, 2, BATCH).astype(np.float32))
        yield u, uo, i, io, y


RULES = [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.5), evdb.optim.SGD(lr=0.5)),
    (
        "adagrad",
        lambda p: torch.optim.Adagrad(p, lr=0.3, initial_accumulator_value=0.1, eps=1e-10),
        evdb.optim.Adagrad(lr=0.3, initial_accumulator=0.1, eps=1e-10),
    ),
    ("sparse_adam", lambda p: torch.optim.SparseAdam(p, lr=0.05), evdb.optim.Adam(lr=0.05)),
]


@pytest.mark.parametrize("name,torch_rule,evdb_rule", RULES, ids=[r[0] for r in RULES])
def test_losses_match_torch_embedding_bag_at_every_step(db, name, torch_rule, evdb_rule) -> None:
    rng = np.random.default_rng(0)
    starts = [rng.standard_normal((VOCAB, DIM)).astype(np.float32) * 0.3 for _ in range(2)]
    ref_tables = []
    for mode, start in zip(("sum", "mean"), starts, strict=True):
        e = torch.nn.EmbeddingBag(VOCAB, DIM, mode=mode, sparse=True)
        with torch.no_grad():
            e.weight.copy_(torch.from_numpy(start))
        ref_tables.append(e)
    ref = Model(*ref_tables)
    ref_sparse = torch_rule([t.weight for t in ref_tables])
    ref_dense = torch.optim.SGD(ref.mlp.parameters(), lr=0.1)

    mods = []
    for name_, mode, start in zip(("user", "item"), ("sum", "mean"), starts, strict=True):
        t = db.create_table(name_, dim=DIM, optimizer=evdb_rule)
        t.upsert(np.arange(VOCAB), start)
        mods.append(EmbeddingBag(t, mode=mode))
    model = Model(*mods)
    dense = torch.optim.SGD(model.mlp.parameters(), lr=0.1)
    assert not list(mods[0].parameters())  # rows are not torch parameters

    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step, (u, uo, i, io, y) in enumerate(batches()):
        losses = []
        for m, opts in ((ref, (ref_sparse, ref_dense)), (model, (dense,))):
            loss = loss_fn(m(u, uo, i, io), y)
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
            losses.append(loss.item())
        db.advance()
        assert abs(losses[0] - losses[1]) < 1e-5, f"step {step}: {losses}"
    for e, t in zip(ref_tables, ("user", "item"), strict=True):
        np.testing.assert_allclose(
            db.table(t).lookup(np.arange(VOCAB)), e.weight.detach(), rtol=1e-4, atol=1e-5
        )


def test_admission_and_ttl_act_while_training(db) -> None:
    t = db.create_table("t", dim=4, admission=evdb.admission.Counter(min_count=2), ttl_steps=3)
    emb = EmbeddingBag(t, mode="sum")
    keys, offsets = torch.tensor([1, 2, 2]), torch.tensor([0, 1])
    emb(keys, offsets).sum().backward()
    assert t.contains([1, 2]).tolist() == [False, True]  # 2 was pulled twice
    emb(keys, offsets).sum().backward()
    assert t.contains([1, 2]).tolist() == [True, True]
    db.advance(4)  # both rows expire
    assert t.contains([1, 2]).tolist() == [False, False]
    emb(torch.tensor([2]), torch.tensor([0])).sum().backward()
    assert t.contains([2]).tolist() == [False]  # afresh: its admission count restarted
    emb(torch.tensor([2]), torch.tensor([0])).sum().backward()
    assert t.contains([1, 2]).tolist() == [False, True]
    assert t.stats()["expired_on_pull"] == 1


def test_eval_and_no_grad_are_lookups(db) -> None:
    t = db.create_table("t", dim=3)
    emb = EmbeddingBag(t, mode="mean").eval()
    out = emb(torch.tensor([5, 6]), torch.tensor([0]))
    assert not out.requires_grad and len(t) == 0
    np.testing.assert_allclose(out.numpy(), t.lookup([5, 6], [0]))
    emb.train()
    with torch.no_grad():
        emb(torch.tensor([5, 6]), torch.tensor([0]))
    assert len(t) == 0  # no counting, no row creation
    emb(torch.tensor([5, 6]), torch.tensor([0]))
    assert len(t) == 2


def test_input_conventions_of_torch_embedding_bag(db) -> None:
    t = db.create_table("t", dim=2, initializer=evdb.init.Zeros())
    t.upsert([1, 2, 3], [[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    emb = EmbeddingBag(t, mode="sum").eval()
    two_d = emb(torch.tensor([[1, 2], [3, 3]]))
    assert two_d.tolist() == [[3.0, 3.0], [8.0, 8.0]]
    last = EmbeddingBag(t, mode="sum", include_last_offset=True).eval()
    got = last(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3])).tolist()
    assert got == [[3.0, 3.0], [4.0, 4.0]]
    pad = EmbeddingBag(t, mode="mean", padding_idx=2).eval()
    assert pad(torch.tensor([1, 2, 3]), torch.tensor([0])).tolist() == [[2.5, 2.5]]
    w = emb(torch.tensor([1, 3]), torch.tensor([0]), per_sample_weights=torch.tensor([2.0, 0.5]))
    assert w.tolist() == [[4.0, 4.0]]


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda e: e(torch.tensor([[1]]), torch.tensor([0])), ValueError, "if input is 2D"),
        (lambda e: e(torch.tensor([1])), ValueError, "offsets has to be a 1D Tensor but got None"),
        (lambda e: e(torch.tensor([[[1]]])), ValueError, "input has to be 1D or 2D"),
        (lambda e: e(torch.tensor([1.5]), torch.tensor([0])), TypeError, "integer tensor"),
        (
            lambda e: e(torch.tensor([1, 2]), torch.tensor([1])),
            ValueError,
            r"offsets\[0\] must be 0",
        ),
        (
            lambda e: e(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(3)),
            ValueError,
            "must have the same shape as the input",
        ),
        (
            lambda e: EmbeddingBag(e.table, padding_idx=2)(
                torch.tensor([1, 2]), torch.tensor([0, 3])
            ),
            ValueError,
            r"offsets\[1\] = 3 is past the end",
        ),
    ],
)
def test_bad_input_raises_clearly(db, call, error, message) -> None:
    emb = EmbeddingBag(db.create_table("t", dim=2), mode="sum")
    with pytest.raises(error, match=message):
        call(emb)


def test_per_sample_weights_need_mode_sum_and_get_gradients(db) -> None:
    t = db.create_table("t", dim=2, initializer=evdb.init.Ones())
    with pytest.raises(NotImplementedError, match="only supported for mode='sum'"):
        EmbeddingBag(t, mode="mean")(torch.tensor([1]), torch.tensor([0]), torch.ones(1))
    w = torch.tensor([2.0, 3.0], requires_grad=True)
    EmbeddingBag(t, mode="sum")(torch.tensor([1, 2]), torch.tensor([0]), w).sum().backward()
    assert w.grad.tolist() == [2.0, 2.0]  # d sum(w x) / d w = sum(x) = 2 for a row of ones


def test_nan_gradients_raise_and_change_nothing(db) -> None:
    t = db.create_table("t", dim=2)
    emb = EmbeddingBag(t, mode="sum")
    out = emb(torch.tensor([1]), torch.tensor([0]))
    before = t.lookup([1])
    with pytest.raises(ValueError, match=r"grad_out.*is not finite"):
        (out * torch.tensor(float("nan"))).sum().backward()
    np.testing.assert_array_equal(t.lookup([1]), before)


def test_fused_optimizer_lr_follows_a_torch_scheduler(db) -> None:
    t = db.create_table("t", dim=1, optimizer=evdb.optim.SGD(lr=1.0), initializer=evdb.init.Zeros())
    emb = EmbeddingBag(t, mode="sum")
    sched = torch.optim.lr_scheduler.StepLR(emb.fused_optimizer, step_size=1, gamma=0.1)
    for _ in range(2):
        emb(torch.tensor([7]), torch.tensor([0])).sum().backward()
        emb.fused_optimizer.step()
        sched.step()
    np.testing.assert_allclose(t.lookup([7]), [[-1.1]], rtol=1e-6)  # lr 1.0, then 0.1
    assert emb.fused_optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_state_dict_names_the_table_and_holds_no_rows(db) -> None:
    t = db.create_table("t", dim=2)
    state = EmbeddingBag(t).state_dict()
    assert list(state) == ["_extra_state"] and state["_extra_state"]["table"] == "t"
    EmbeddingBag(t).load_state_dict(state)
    with pytest.raises(ValueError, match="for table 't'"):
        EmbeddingBag(db.create_table("u", dim=2)).load_state_dict(state)


def test_modules_sharing_a_table_and_a_collection_with_one_push_per_table(db) -> None:
    shared = db.create_table(
        "shared", dim=2, optimizer=evdb.optim.SGD(lr=1.0), initializer=evdb.init.Zeros()
    )
    other = db.create_table("other", dim=2, initializer=evdb.init.Zeros())
    ebc = EmbeddingBagCollection({"a": shared, "b": shared, "c": other}, mode="sum")
    feats = {
        "a": (torch.tensor([1, 2]), torch.tensor([0, 1])),
        "b": (torch.tensor([1]), torch.tensor([0])),
        "c": (torch.tensor([9, 9]), torch.tensor([0, 0])),
    }
    out = ebc(feats)
    assert [v.shape for v in out.values()] == [(2, 2), (1, 2), (2, 2)]
    sum(v.sum() for v in out.values()).backward()
    assert shared.stats()["pushes"] == 1 and other.stats()["pushes"] == 1
    np.testing.assert_allclose(shared.lookup([1, 2]), [[-2.0, -2.0], [-1.0, -1.0]])
    cat = EmbeddingBagCollection({"a": shared, "c": other}, concat=True).eval()
    assert cat({"a": feats["a"], "c": feats["c"]}).shape == (2, 4)


def test_stacked_outputs_equal_the_stacked_dict_and_train_the_same(tmp_path) -> None:
    """stack=True: one (features, B, dim) tensor, with the dict's values and gradients, for
    features on one table (the pooled output itself) and on several (a stack of them)."""
    rng = np.random.default_rng(4)
    feats = {
        n: (torch.from_numpy(rng.integers(0, 50, 12)), torch.tensor([0, 3, 3, 7]))
        for n in ("a", "b", "c")
    }
    weights = torch.from_numpy(rng.standard_normal((3, 4, 3)).astype(np.float32))
    for layout in ({"a": "t", "b": "t", "c": "t"}, {"a": "t", "b": "u", "c": "t"}):
        results = []
        for stack in (False, True):
            db = evdb.open(tmp_path / f"{stack}-{'-'.join(layout.values())}")
            tables = {
                n: db.create_table("t", dim=3, optimizer=evdb.optim.Adagrad(lr=0.1))
                if n == "t"
                else None
                for n in set(layout.values())
            }
            if "u" in tables:
                tables["u"] = db.create_table("u", dim=3, optimizer=evdb.optim.Adagrad(lr=0.1))
            ebc = EmbeddingBagCollection({f: tables[t] for f, t in layout.items()}, stack=stack)
            for _ in range(3):
                out = ebc(feats)
                stacked = out if stack else torch.stack(list(out.values()))
                (stacked * weights).sum().backward()
                db.advance()
            rows = {t: db.table(t).lookup(np.arange(50)) for t in sorted(tables)}
            results.append((stacked.detach().clone(), rows))
            db.close()
        (plain, plain_rows), (stacked, stacked_rows) = results
        assert stacked.shape == (3, 4, 3)
        torch.testing.assert_close(stacked, plain)
        for t in plain_rows:
            np.testing.assert_array_equal(stacked_rows[t], plain_rows[t])


def test_stack_refuses_features_of_different_batch_sizes(db) -> None:
    t = db.create_table("t", dim=2)
    ebc = EmbeddingBagCollection({"a": t, "b": t}, stack=True)
    feats = {
        "a": (torch.tensor([1, 2]), torch.tensor([0, 1])),
        "b": (torch.tensor([1]), torch.tensor([0])),
    }
    with pytest.raises(ValueError, match=r"features\['b'\] has 1 bags"):
        ebc(feats)
    assert len(t) == 0  # refused before anything was pulled
    with pytest.raises(ValueError, match="concat and stack"):
        EmbeddingBagCollection({"a": t}, concat=True, stack=True)


class FakeKJT:
    """The duck-typed surface of torchrec.sparse.jagged_tensor.KeyedJaggedTensor."""

    def __init__(self, keys, values, lengths, weights=None):
        self._k, self._v, self._l, self._w = keys, values, lengths, weights

    def keys(self):
        return self._k

    def values(self):
        return self._v

    def lengths(self):
        return self._l

    def offsets(self):
        return torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(self._l, 0)])

    def weights_or_none(self):
        return self._w


def test_collection_accepts_a_keyed_jagged_tensor(db) -> None:
    t = db.create_table("t", dim=2, initializer=evdb.init.Zeros())
    t.upsert([1, 2, 3], [[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    ebc = EmbeddingBagCollection({"f": t, "g": t}, mode="sum").eval()
    # f: bags [1, 2] and []; g: bags [3] and [3, 1]
    kjt = FakeKJT(["f", "g"], torch.tensor([1, 2, 3, 3, 1]), torch.tensor([2, 0, 1, 2]))
    out = ebc(kjt)
    assert out["f"].tolist() == [[3.0, 3.0], [0.0, 0.0]]
    assert out["g"].tolist() == [[4.0, 4.0], [5.0, 5.0]]


def test_bfloat16_autocast_output_and_torch_compile(db) -> None:
    t = db.create_table("t", dim=4)
    emb = EmbeddingBag(t, mode="sum")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = emb(torch.tensor([1, 2]), torch.tensor([0]))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()  # the gradient comes back through the cast
    assert t.stats()["pushes"] == 1
    compiled = torch.compile(lambda k, o: emb(k, o) * 2, backend="eager")
    emb.eval()
    np.testing.assert_allclose(
        compiled(torch.tensor([1, 2]), torch.tensor([0])).numpy(),
        2 * emb(torch.tensor([1, 2]), torch.tensor([0])).numpy(),
    )


def test_a_str_table_takes_its_keys_as_strings(db) -> None:
    t = db.create_table(
        "w", dim=3, key_type="str", keep_strings=True, optimizer=evdb.optim.SGD(lr=1.0)
    )
    emb = EmbeddingBag(t, mode="sum")
    words, offsets = ["a", "b", "a", "c"], torch.tensor([0, 2])
    before = t.lookup(words)
    out = emb(words, offsets)
    np.testing.assert_allclose(
        out.detach().numpy(), [before[0] + before[1], before[2] + before[3]], rtol=1e-6
    )
    out.sum().backward()  # every row's gradient is its count: a was in a bag twice
    np.testing.assert_allclose(
        t.lookup(["a", "b", "c"]), before[[0, 1, 3]] - [[2.0], [1.0], [1.0]], rtol=1e-6
    )
    assert t.strings(["a", "b", "c"]) == ["a", "b", "c"]
    emb.eval()
    np.testing.assert_array_equal(emb(["zz"], [0]).detach().numpy(), t.lookup(["zz"]))
    ints = EmbeddingBag(db.create_table("i", dim=3), mode="sum")
    with pytest.raises(TypeError, match=r"table 'i' \(key_type='int64'\)"):
        ints(["a"], [0])


def test_a_collection_from_torchrec_style_configs(db) -> None:
    from types import SimpleNamespace as Config

    configs = [
        Config(name="t_user", embedding_dim=4, num_embeddings=10, feature_names=["user"]),
        Config(name="t_item", embedding_dim=3, num_embeddings=10, feature_names=["item", "seen"]),
    ]
    ebc = EmbeddingBagCollection.from_configs(db, configs, optimizer=evdb.optim.SGD(lr=0.1))
    assert sorted(db.tables()) == ["t_item", "t_user"] and db.table("t_item").dim == 3
    assert ebc.tables["seen"] is ebc.tables["item"] and ebc.mode == "sum"
    out = ebc({"user": (torch.tensor([1, 2]), torch.tensor([0, 1])),
               "item": (torch.tensor([5, 6, 7]), torch.tensor([0, 2])),
               "seen": (torch.tensor([7]), torch.tensor([0, 1]))})  # fmt: skip
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "user": (2, 4),
        "item": (2, 3),
        "seen": (2, 3),
    }
    again = EmbeddingBagCollection.from_configs(db, configs)  # the tables exist: reused
    assert again.tables["user"] is ebc.tables["user"]
    with pytest.raises(ValueError, match="exists with dim 4, not 8"):
        EmbeddingBagCollection.from_configs(
            db, [Config(name="t_user", embedding_dim=8, feature_names=["u"])]
        )
    mean = Config(name="m", embedding_dim=2, feature_names=["a"], pooling=Config(name="MEAN"))
    total = Config(name="s", embedding_dim=2, feature_names=["b"], pooling=Config(name="SUM"))
    assert EmbeddingBagCollection.from_configs(db, [mean]).mode == "mean"
    with pytest.raises(ValueError, match="pool alike"):
        EmbeddingBagCollection.from_configs(db, [mean, total])


def test_torchrec_configs_and_keyed_jagged_tensors_where_torchrec_installs(db) -> None:
    modules = pytest.importorskip("torchrec.modules.embedding_configs")
    jagged = pytest.importorskip("torchrec.sparse.jagged_tensor")
    configs = [
        modules.EmbeddingBagConfig(
            name="t0", embedding_dim=4, num_embeddings=100, feature_names=["f0", "f1"]
        )
    ]
    ebc = EmbeddingBagCollection.from_configs(db, configs)
    kjt = jagged.KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([1, 2, 3, 4]), lengths=torch.tensor([1, 1, 2, 0])
    )
    out = ebc(kjt)
    assert tuple(out["f0"].shape) == (2, 4) and tuple(out["f1"].shape) == (2, 4)


def test_stats_logger_writes_each_tables_figures_under_the_metrics_names(db) -> None:
    from evdb.torch_metrics import StatsLogger

    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

    t = db.create_table("item", dim=2, dram_rows=10, admission=evdb.admission.Counter(min_count=2))
    t.upsert(np.arange(30), np.ones((30, 2), np.float32))
    writer = Writer()
    log = StatsLogger(writer, [t])
    t.push(t.pull(np.arange(40)), np.zeros((40, 2), np.float32))  # 10 new keys: not admitted
    first = log.log(1)
    reads = t.stats()["reads"]["pull"]
    assert first["evdb_table_rows/item"] == 30 and first["evdb_not_admitted/item"] == 10
    assert first["evdb_reads/item/pull/not_found"] == reads["not_found"] == 10
    assert sum(v for k, v in first.items() if k.startswith("evdb_read_share/item/pull/")) == 1
    assert writer.scalars == [(tag, float(v), 1) for tag, v in first.items()]
    t.lookup(np.arange(5))
    second = log.log(2)  # shares over the interval: the 5 lookups only
    looked = {k.rsplit("/", 1)[1]: v for k, v in second.items() if "read_share/item/lookup" in k}
    assert sum(looked.values()) == 1 and "evdb_read_share/item/pull/dram" not in second
