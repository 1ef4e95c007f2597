"""Rank script (NumPy only, no Horovod): the ``hvdcomp.TopK`` compressor's compress/decompress
protocol on host arrays, for both paths, bidirectional and not, over several steps:

- results bit-identical on every rank;
- error feedback conserves mass exactly, element by element: with integer-valued gradients,
  ``size * applied == sum over ranks of (a_i - e_i)`` where ``a_i = e_i_old + g_i`` (the values
  that left the memories are exactly what was applied), and each ``e_i[j]`` is ``a_i[j]`` or 0;
- per tensor at most k_t applied indices (bidirectional), each rank's sent count within +-50%;
- small tensors summed densely; a checkpoint (state_dict / load_state_dict) resumes bit for bit.
Raises on any failed check; reports counts and the bytes each rank sent per step."""
import copy
import hashlib

import numpy as np
from mpi4py import MPI

import hvdcomp
from hvdcomp.facade.frontends.numpy import named
from report import report

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
SIZES = [70000, 3000, 10]  # approx selection (>= 2**16), exact fallback size, dense
RATIO = 0.01
KS = [700, 30]
checks, sent_bytes = 0, {}


def grads(step):
    rng = np.random.default_rng([rank, step])
    return [rng.integers(-20, 21, n).astype(np.float32) for n in SIZES]


def run_step(comp, step):
    tickets = [comp.compress(named(g, f"t{t}")) for t, g in enumerate(grads(step))]
    return [comp.decompress(ph, ctx) for ph, ctx in tickets]


def memories(comp):
    mem = comp.state_dict()["state"]
    return [mem.get(f"t{t}", np.zeros(n, np.float32)) for t, n in enumerate(SIZES[:2])]


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


for path in ("tree", "allgather"):
    for bidir in (True, False):
        comp = hvdcomp.TopK(ratio=RATIO, path=path, bidirectional=bidir, min_compress_numel=64,
                            seed=7)
        for step in range(4):
            old = memories(comp)
            outs = run_step(comp, step)
            new = memories(comp)
            assert len(set(world.allgather(digest(outs)))) == 1, "ranks disagree"
            for t in range(2):
                a = old[t] + grads(step)[t]
                e = new[t]
                assert np.all((e == a) | (e == 0)), "memory is not a with some zeros"
                left = world.allgather(a - e)
                gone = np.sum(np.stack(left).astype(np.float64), axis=0)
                applied = outs[t].astype(np.float64) * size
                assert np.abs(applied - np.round(applied)).max() < 1e-3
                assert np.array_equal(np.round(applied), gone), (path, bidir, step, t)
                nz = np.count_nonzero(outs[t])
                if bidir:
                    assert nz <= KS[t], (nz, KS[t])
                if not bidir:  # unidirectional: what left the memory is what was sent
                    sent = np.count_nonzero((e == 0) & (a != 0))
                    assert sent <= 1.5 * KS[t], (sent, KS[t])
            dense = np.sum(np.stack(world.allgather(grads(step)[2])), axis=0) / size
            assert np.allclose(outs[2], dense, rtol=1e-6, atol=1e-6)
            checks += 1
        sent_bytes[f"{path}-{'bi' if bidir else 'uni'}"] = comp.last_stats.bytes_sent

        # checkpoint after 4 steps, then 2 more steps twice: uninterrupted and restored
        state = copy.deepcopy(comp.state_dict())
        cont = [run_step(comp, s) for s in (4, 5)]
        comp2 = hvdcomp.TopK(ratio=RATIO, path=path, bidirectional=bidir, min_compress_numel=64,
                             seed=7)
        comp2.load_state_dict(state)
        again = [run_step(comp2, s) for s in (4, 5)]
        assert digest(sum(cont, [])) == digest(sum(again, [])), "resume diverged"
        assert digest(memories(comp)) == digest(memories(comp2))
        assert comp2.state_dict()["step"] == 6
        checks += 1

# k= instead of ratio=, and the exact selector: each rank sends exactly k per tensor
comp = hvdcomp.TopK(k=25, selection="exact", bidirectional=False, min_compress_numel=64)
run_step(comp, 0)
for t, e in enumerate(memories(comp)):
    a = grads(0)[t]
    assert np.count_nonzero((e == 0) & (a != 0)) <= 25 and np.count_nonzero(e != a) <= 25
checks += 1

report(rank=rank, size=size, checks=checks, sent_bytes=sent_bytes)
