"""Made with hvdcomp at e1d1b9d (checkpoint format 1): one rank, NumPy arrays, three steps, then
state_dict(); the fourth step's gradients and outputs are stored beside it."""
import pickle, sys
import numpy as np
import hvdcomp

def grads(step):
    rng = np.random.default_rng(step)
    return [rng.standard_normal(5000).astype(np.float32), rng.standard_normal(300).astype(np.float32)]

def run(comp, step):
    t = [comp.compress(g) for g in grads(step)]
    return [comp.decompress(p, c) for p, c in t]

out = {}
for name, make in [("marsit-rms", lambda: hvdcomp.Marsit(seed=2, precondition="rms")),
                   ("topk", lambda: hvdcomp.TopK(ratio=0.05, seed=1)),
                   ("binsgdm", lambda: hvdcomp.BinSGDM(seed=4)),
                   ("marsit-adam", lambda: hvdcomp.Marsit(seed=3, precondition=hvdcomp.AdamSettings(warmup=2)))]:
    comp = make()
    for s in range(3):
        run(comp, s)
    state = comp.state_dict()
    assert state["format"] == 1
    out[name] = {"state": state, "grads": grads(3), "expected": run(comp, 3)}
pickle.dump(out, open(sys.argv[1], "wb"))
print({k: sorted(v["state"]["memory"]) for k, v in out.items()})
