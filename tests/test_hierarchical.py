"""Node stages for every method (``hvdcomp.hierarchical``) on real ranks: 4 ranks posing as 2
nodes x 2 ranks (``HVDCOMP_RANKS_PER_NODE=2``), the stock hvd.DistributedOptimizer, each
method's bare defaults (the stages are on by default where nodes have several ranks)."""
import pytest

from mpirun import results, run

from conftest import EPOCHS, decision_results, train_digits
from test_training import TOLERANCE_ACC, TOLERANCE_LOSS, resume_launch

NODES = {"HVDCOMP_RANKS_PER_NODE": "2"}
FLAT = {**NODES, "HVDCOMP_HIERARCHY": "flat"}
METHODS = ["marsit", "topk", "sketchfusion", "efsignsgd", "powersgd"]
# bits per compressed element that leave a node per step, at most (2 nodes: a 1-bit ring sends
# each shard's bits once between the nodes; EF-signSGD's all-gather the same with 2 nodes)
BITS_BETWEEN_NODES = {"marsit": 1.1, "efsignsgd": 1.1}
# The digits runs of these tests: one launch in node stages, one in the flat layout
# (tests/conftest.py ``train_digits``, ``launched_with``), so that the ranks start twice, not
# eleven times: every method for 3 epochs, Marsit under LayerFusion, Marsit and TopK for the
# 20 epochs of the accuracy test; flat, the methods compared with their flat traffic.
IN_NODES = tuple((name, 3) for name in METHODS) + (("marsit-auto", 3), ("marsit", EPOCHS),
                                                    ("topk", EPOCHS))
IN_FLAT = tuple((name, 3) for name in METHODS if name not in BITS_BETWEEN_NODES)
# Their cases of tests/mpi/decision.py: one launch that measures, one that compresses
# (``conftest.decision_results``).
MEASURED = [("marsit", 0.05, "carry"), ("powersgd", 0.05, "carry")]
COMPRESSED = [(name, lr, mode) for mode, lr in (("adam-carry", 0.003), ("resume-pass", 0.05))
              for name in ("marsit", "powersgd")]


def _per_step(r, key):
    return r["stats"][key] / r["steps"]


@pytest.mark.timeout(500)  # the first pays the launch of every case of IN_NODES
@pytest.mark.parametrize("name", METHODS)
def test_every_method_runs_in_node_stages_and_sends_one_shard_per_rank_between_nodes(name):
    """Ranks bit-identical after every step (train_digits); inside the node nothing goes through
    MPI (the exact stages run in the node's shared memory); between the nodes 1-bit methods send
    about one bit per element per node, and the sparse and low-rank ones (PowerSGD: whole
    tensors per local rank) no more than a rank sends in the flat layout."""
    res = train_digits(name, env=NODES, epochs=3, launched_with=IN_NODES)
    for r in res.values():
        assert r["layout"] == "2 node(s) x 2 rank(s)"
        assert r["legs"]["intra"] == 0 and r["legs"]["inter"] > 0 and r["compressed"] > 0
    d = res[0]["compressed"]
    node_inter = [res[2 * k]["legs"]["inter"] + res[2 * k + 1]["legs"]["inter"] for k in (0, 1)]
    print(f"{name}: {d} compressed elements, bytes between nodes per node and step "
          f"{node_inter}, {8 * max(node_inter) / d:.2f} bits per element")
    if name in BITS_BETWEEN_NODES:
        assert 8 * max(node_inter) / d <= BITS_BETWEEN_NODES[name]
    else:
        flat = train_digits(name, env=FLAT, epochs=3, launched_with=IN_FLAT)
        assert "legs" not in flat[0]  # no stages asked for: the method alone, over every rank
        assert max(node_inter) <= min(_per_step(r, "bytes_sent") for r in flat.values())


@pytest.mark.timeout(500)
@pytest.mark.parametrize("name", ["marsit", "topk"])
def test_node_stages_train_like_uncompressed(name, uncompressed):
    """20 epochs in node stages: the uncompressed accuracy and loss within the tolerance every
    method's flat run is held to (tests/test_training.py)."""
    r = train_digits(name, env=NODES, launched_with=IN_NODES)[0]
    print(f"{name} in node stages: acc {r['acc']:.4f} loss {r['loss']:.4f}; uncompressed "
          f"{uncompressed['acc']:.4f} / {uncompressed['loss']:.4f}")
    assert r["acc"] >= uncompressed["acc"] - TOLERANCE_ACC
    assert r["loss"] <= uncompressed["loss"] + TOLERANCE_LOSS


RESUME = (("marsit", "rank"), ("topk", "gathered"), ("sketchfusion", "rank"),
          ("efsignsgd", "gathered"), ("powersgd", "rank"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, form", RESUME)
def test_a_resume_in_node_stages_is_bit_identical(name, form):
    """Each rank's state is its shard's (under the tensor's name): a checkpoint restores it.
    PowerSGD's shares are whole tensors: the two local ranks of a node hold disjoint halves of
    the memories and Qs, the same names on both nodes."""
    res = results(resume_launch(RESUME, 4, 2), case=f"{name}-{form}")  # 4 ranks, 2 per node
    assert sorted(res) == [0, 1, 2, 3]
    weights = {"0.weight", "2.weight", "4.weight"}
    keys = [{k for k in res[rank]["memory_keys"] if not k.endswith("#owner")} for rank in range(4)]
    for r in res.values():
        assert r["identical_steps"] == 12 and r["same"] and r["fresh_differs"]
        assert r["memory_norm"] > 0
    if name == "powersgd":
        for a, b in ((0, 1), (2, 3)):  # ranks 2k and 2k+1: node k's local ranks 0 and 1
            assert not keys[a] & keys[b], keys
            assert keys[a] | keys[b] == weights | {w + "#q" for w in weights}, keys
        assert keys[0] == keys[2] and keys[1] == keys[3], keys
        owners = {k for k in res[0]["memory_keys"] if k.endswith("#owner")}
        assert owners == {w + "#owner" for w in weights}  # recorded on every rank
        assert all(owners <= set(r["memory_keys"]) for r in res.values())
    else:
        assert all(k == weights for k in keys), keys
    assert len({r["memory_norm"] for r in res.values()}) == 4  # four shards' memories


@pytest.mark.timeout(500)  # the first pays the launch of every case of COMPRESSED
@pytest.mark.parametrize("name", ["marsit", "powersgd"])
def test_under_adamw_a_passed_tensor_hands_its_shards_memory_to_adams_momentum(name):
    """Node stages under the user's AdamW, a tensor passed after compressed steps: Adam's
    moments after that step are ``b1 m + (1 - b1) mean(g) + mean(e)`` and ``b2 v + (1 - b2)
    mean(g)**2`` on every rank, ``e`` the mean over nodes of the shard memories (PowerSGD: of
    the whole tensors' owners). Every rank sends ``[g, e]`` in that step, a rank without a
    memory zeros: PowerSGD's non-owners sent ``g`` alone before 2026-11-28, a ring of other
    sizes than the owner's (MPI_ERR_IN_STATUS on some ranks, the others waiting for ever)
    (tests/mpi/decision.py adam-carry)."""
    res = decision_results(name, 0.003, "adam-carry", COMPRESSED,
                           {**NODES, "HVDCOMP_DECISION": "compress"})
    assert sorted(res) == list(range(4))
    for r in res.values():
        assert r["identical"]
        assert [t for t in r["tensors"].values() if t["memory"] > 0], r["tensors"]
        for n, t in r["tensors"].items():
            assert t["passed"]
            assert t["m_error"] <= 1e-5 * t["m_scale"] + 1e-9, (n, t)
            assert t["v_error"] <= 1e-5 * t["v_scale"] + 1e-12, (n, t)


@pytest.mark.timeout(500)  # the first pays the launch of both cases
@pytest.mark.parametrize("name", ["marsit", "powersgd"])
def test_a_tensor_the_decision_passes_carries_its_shards_memory(name):
    """The compress-or-pass decision in node stages: the same thresholds on every rank, and over
    every compressed -> passed switch the applied steps equal the mean gradients plus the mean
    over nodes of the shard memories (PowerSGD: of the whole tensors' owners)
    (tests/mpi/decision.py)."""
    res = decision_results(name, 0.05, "carry", MEASURED, {**NODES, "HVDCOMP_DECISION": "measure"})
    ours = res[0]
    assert ours["identical"] == ours["steps"]
    assert all(r["thresholds"] == ours["thresholds"] for r in res.values())
    runs = [r for r in ours["runs"] if r["memory"] > 0]
    assert runs, ours["runs"]
    for r in runs:  # exact to float32's rounding, plus float16's over steps passed in it
        assert r["error"] <= 1e-4 * r["scale"] + 1e-6 + r["fp16_rounding"], r


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["marsit", "powersgd"])
def test_a_resumed_compressor_passing_at_its_first_step_carries_the_saved_memory(name):
    """A checkpoint of node stages' memories (element shards; PowerSGD: whole tensors) loaded by
    a fresh compressor, which knows no node layout yet and passes every tensor at its first step:
    the applied step is the mean gradient plus the mean over nodes of the saved memories, on
    every rank alike (tests/mpi/decision.py, 'resume-pass')."""
    res = decision_results(name, 0.05, "resume-pass", COMPRESSED,
                           {**NODES, "HVDCOMP_DECISION": "compress"})
    assert all(r["identical"] and r["passed"] for r in res.values())
    tensors = res[0]["tensors"]
    assert any(t["memory"] > 0 for t in tensors.values()), tensors
    for n, t in tensors.items():
        assert t["error"] <= 1e-4 * t["scale"] + 1e-6, (n, t)


@pytest.mark.timeout(500)
def test_node_stages_under_layerfusion_and_tensorflow():
    """The stages wrap the method wherever the engine runs it: LayerFusion's buckets (reduced by
    its worker thread) and TensorFlow's traced step (tape and Keras model.fit); ranks stay
    bit-identical."""
    res = train_digits("marsit-auto", env=NODES, epochs=3, launched_with=IN_NODES)
    assert res[0]["layout"] == "2 node(s) x 2 rank(s)" and res[0]["legs"]["inter"] > 0
    res = results(run(4, "tf_train.py", "topk", 10, timeout=360, env=NODES))
    for r in res.values():
        assert r["eager_identical"] and r["tape_identical"] == r["tape_steps"] > 0
        assert r["keras_identical"] == r["keras_steps"] > 0
