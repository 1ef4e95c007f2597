"""Rank script (one rank, NumPy, no Horovod): checkpoints written in format 1 (hvdcomp before the
format-2 layout; tests/data/checkpoint_format1.pkl, made by tests/data/make_format1.py) load into
today's compressors, which then take the next step exactly as the old release did. BinSGDM's
votes are drawn from another random stream since (hvdcomp.methods.binsgdm.stochastic: a counter hash
where the old release used PCG64), so its next step is checked against the reference math on the
loaded moments with today's stream (``binsgdm_expected``)."""
import os
import pickle

import numpy as np

import hvdcomp
from hvdcomp.methods.binsgdm import math as alg
from hvdcomp.facade.frontends.numpy import named
from report import report

HERE = os.path.dirname(os.path.abspath(__file__))
MAKERS = {"marsit-rms": lambda: hvdcomp.Marsit(seed=2, precondition="rms"),
          "topk": lambda: hvdcomp.TopK(ratio=0.05, seed=1),
          "binsgdm": lambda: hvdcomp.BinSGDM(seed=4),
          "marsit-adam": lambda: hvdcomp.Marsit(seed=3,
                                                precondition=hvdcomp.AdamSettings(warmup=2))}



def binsgdm_expected(comp, case):
    """The one-rank outputs of BinSGDM's next step from the checkpoint's moments: its own votes
    (keyed by seed, step, rank 0), split per tensor, as float32."""
    keys = sorted(case["state"]["memory"])
    moments = [alg.update_moments(g, tuple(case["state"]["memory"][k]), *comp.betas)
               for k, g in zip(keys, case["grads"])]
    u = np.concatenate([alg.direction(m, v, comp.eps) for m, v in moments])
    votes = alg.binarise(u, (comp.seed, case["state"]["step"], 0, alg.VOTE)).astype(np.float32)
    return np.split(votes, np.cumsum([g.size for g in case["grads"]])[:-1])


with open(os.path.join(HERE, "..", "data", "checkpoint_format1.pkl"), "rb") as fh:
    saved = pickle.load(fh)
out = {}
for name, make in MAKERS.items():
    case, comp = saved[name], make()
    assert case["state"]["format"] == 1
    comp.load_state_dict(case["state"])
    # format 1 kept unnamed NumPy arrays under their arrival order, '@000000', '@000001'
    tickets = [comp.compress(named(g, f"@{i:06d}")) for i, g in enumerate(case["grads"])]
    got = [comp.decompress(p, c) for p, c in tickets]
    expected = binsgdm_expected(comp, case) if name == "binsgdm" else case["expected"]
    out[name] = all(np.array_equal(a, b) for a, b in zip(got, expected))
    resaved = comp.state_dict()
    out[name + ".format"] = resaved["format"]
    out[name + ".keys"] = sorted(resaved["state"]) == sorted(case["state"]["memory"])
report(rank=0, **out)
