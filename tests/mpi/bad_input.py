"""Rank script (2+ ranks): bad and unusual input through real Horovod for every hvdcomp method.
Per method it reports (keys prefixed by the method's name):
- lowp_<dt>: fp16/bf16 gradients: [dtype kept, shape kept, finite, equal to the float32 path
  on the same values cast back once, some nonzero];
- empty / scalar: shape and value of an empty and a 0-d tensor;
- unsupported_<dt>: the UnsupportedTensorError message for int32, int64, bool, complex64 and a
  sparse tensor handed to hvd.allreduce;
- shape_error / numel_error / dtype_error: RankMismatchError messages for a tensor whose shape
  (same numel), element count or dtype differs between ranks;
- nan_error / inf_error: NonFiniteGradientError messages (NaN / Inf on the last rank only,
  on_nonfinite='raise'); propagated: the default 'propagate' (NaN out, state unchanged);
- sparse_same / sparse_identical / dense_*: nn.Embedding(sparse=True) through
  hvd.DistributedOptimizer without and with sparse_as_dense;
- count_error: RankMismatchError when the last rank has one gradient fewer (a frozen layer).
"""
import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from hvdcomp import registry
from report import report
from torch_common import identical_across_ranks, make_model
import expect  # noqa: E402  (tests/expect.py)

hvd.init()
rank, size = hvd.rank(), hvd.size()
last = size - 1
# Every method of hvdcomp/registry.py, sized for these tensors (EXPECT.test_kwargs); the NaN/Inf
# cases rely on on_nonfinite='raise', so it is passed explicitly.
METHODS = {m: (lambda cls=cls, m=m: cls(seed=1, on_nonfinite="raise",
                                        **expect.EXPECT[m].test_kwargs))
           for m, cls in registry.METHODS.items()}
out = {}


def error_of(fn, exc_type):
    try:
        fn()
    except exc_type as exc:
        return str(exc)
    return None


def sparse_model(sparse):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(3000, 4, sparse=sparse)   # 12000 elements: compressed if dense
    w = torch.nn.Parameter(torch.randn(2000))           # a dense gradient in the same step
    return emb, w


def sparse_run(compression, sparse_as_dense, prefix, steps=3):
    emb, w = sparse_model(True)
    named = [(f"{prefix}.emb", emb.weight), (f"{prefix}.w", w)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([emb.weight, w], lr=0.1), named_parameters=named,
                                   compression=compression, sparse_as_dense=sparse_as_dense)
    x = torch.randn(2000, generator=torch.Generator().manual_seed(rank))
    for step in range(steps):
        opt.zero_grad()
        idx = torch.tensor([rank, 7 + step, 2990 - rank])
        (emb(idx).sum() + (w * x).sum()).backward()
        opt.step()
    return emb.weight.detach().clone(), w.detach().clone()


for m, make in METHODS.items():
    # fp16 / bf16: computed in float32, returned in the input dtype
    for dt in (torch.float16, torch.bfloat16):
        g = torch.randn(5000, generator=torch.Generator().manual_seed(rank)).to(dt)
        low = hvd.allreduce(g, name=f"{m}.lowp.{dt}", compression=make())
        ref = hvd.allreduce(g.float(), name=f"{m}.ref.{dt}", compression=make())
        out[f"{m}.lowp_{str(dt)[6:]}"] = [
            low.dtype == dt, low.shape == g.shape, bool(torch.isfinite(low.float()).all()),
            torch.equal(low, ref.to(dt)), int(torch.count_nonzero(low))]
    # empty and 0-d
    e = hvd.allreduce(torch.zeros(0), name=f"{m}.empty", compression=make())
    z = hvd.allreduce(torch.tensor(float(rank)), name=f"{m}.scalar", compression=make())
    out[f"{m}.empty"] = [list(e.shape), e.numel(), str(e.dtype)]
    out[f"{m}.scalar"] = [list(z.shape), float(z), str(z.dtype)]
    # unsupported dtypes
    for dt in (torch.int32, torch.int64, torch.bool, torch.complex64):
        t = torch.ones(3000, dtype=dt)
        out[f"{m}.unsupported_{str(dt)[6:]}"] = error_of(
            lambda: hvd.allreduce(t, name=f"{m}.bad_{str(dt)[6:]}", compression=make()),
            hvdcomp.UnsupportedTensorError)
    sp = torch.ones(3000).to_sparse()  # a sparse tensor handed to hvd.allreduce directly
    out[f"{m}.unsupported_sparse"] = error_of(
        lambda: hvd.allreduce(sp, name=f"{m}.bad_sparse", compression=make()),
        hvdcomp.UnsupportedTensorError)
    # shapes / counts / dtypes that differ between ranks under one name
    shaped = torch.ones((30, 100) if rank == last else (100, 30))
    out[f"{m}.shape_error"] = error_of(
        lambda: hvd.allreduce(shaped, name=f"{m}.shaped", compression=make()),
        hvdcomp.RankMismatchError)
    counted = torch.ones(2000 + 100 * rank)
    out[f"{m}.numel_error"] = error_of(
        lambda: hvd.allreduce(counted, name=f"{m}.counted", compression=make()),
        hvdcomp.RankMismatchError)
    typed = torch.ones(3000, dtype=torch.float64 if rank == last else torch.float32)
    out[f"{m}.dtype_error"] = error_of(
        lambda: hvd.allreduce(typed, name=f"{m}.typed", compression=make()),
        hvdcomp.RankMismatchError)
    # non-finite values on the last rank only
    for kind, value in (("nan", float("nan")), ("inf", float("inf"))):
        g = torch.ones(3000)
        if rank == last:
            g[17] = value
        out[f"{m}.{kind}_error"] = error_of(
            lambda: hvd.allreduce(g, name=f"{m}.{kind}", compression=make()),
            hvdcomp.NonFiniteGradientError)
    # the default on_nonfinite='propagate': NaN out on every rank (as Horovod's allreduce), the
    # state left as it was
    comp = registry.METHODS[m](seed=1, **expect.EXPECT[m].test_kwargs)
    hvd.allreduce(torch.linspace(-1, 1, 3000) * (rank + 1), name=f"{m}.prop", compression=comp)
    before = comp.state_dict()["state"]
    g = torch.ones(3000)
    if rank == last:
        g[17] = float("inf")
    nan_out = hvd.allreduce(g, name=f"{m}.prop", compression=comp)
    after = comp.state_dict()
    out[f"{m}.propagated"] = [
        bool(torch.isnan(nan_out).all()), after["skipped"], sorted(before) == sorted(after["state"])
        and all(all(np.array_equal(x, y) for x, y in zip(*(
            v if isinstance(v, tuple) else (v,) for v in (before[k], after["state"][k]))))
            for k in before)]
    if m == "Marsit":  # precondition='adam', NaN in its second dense warm-up step
        comp = hvdcomp.Marsit(seed=1, precondition=hvdcomp.AdamSettings(warmup=2),
                              on_nonfinite="raise")
        hvd.allreduce(torch.ones(3000), name="adam.nan", compression=comp)  # warm-up step 1
        g = torch.ones(3000)
        if rank == last:
            g[17] = float("nan")
        out["adam.nan_error"] = error_of(
            lambda: hvd.allreduce(g, name="adam.nan", compression=comp),
            hvdcomp.NonFiniteGradientError)
        out["adam.t_after"] = int(comp.state_dict()["state"]["adam.nan#adam"][0])
    # sparse gradients: Horovod reduces them itself (uncompressed); the dense one is compressed
    comp = make()
    emb_c, w_c = sparse_run(comp, False, f"{m}.sp")
    emb_n, w_n = sparse_run(hvd.Compression.none, False, f"{m}.spn")
    out[f"{m}.sparse_same"] = torch.equal(emb_c, emb_n)
    out[f"{m}.sparse_dense_compressed"] = [sorted(comp.state_dict()["state"]),
                                           comp.last_stats.compressed_elements]
    out[f"{m}.sparse_identical"] = len(set(hvd.allgather_object(
        (emb_c.numpy().tobytes(), w_c.numpy().tobytes())))) == 1
    comp = make()
    emb_d, w_d = sparse_run(comp, True, f"{m}.spd")
    out[f"{m}.dense_compressed"] = [sorted(comp.state_dict()["state"]),
                                    comp.last_stats.compressed_elements]
    out[f"{m}.dense_identical"] = len(set(hvd.allgather_object(
        (emb_d.numpy().tobytes(), w_d.numpy().tobytes())))) == 1
    out[f"{m}.dense_finite_moved"] = [bool(torch.isfinite(emb_d).all()),
                                      not torch.equal(emb_d, sparse_model(True)[0].weight)]

# A different number of gradients: the last rank froze its first layer, so its optimizer submits
# one gradient fewer. Last in the script: Horovod keeps the unmatched '<m>.0.weight' allreduce
# of the other ranks pending (it never completes).
for m, make in METHODS.items():
    torch.manual_seed(0)
    model = make_model(hidden=64)
    if rank == last:
        model[0].weight.requires_grad_(False)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), compression=make(),
        named_parameters=[(f"{m}.{n}", p) for n, p in model.named_parameters()])

    def step():
        opt.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
    out[f"{m}.count_error"] = error_of(step, hvdcomp.RankMismatchError)
report(rank=rank, **out)
