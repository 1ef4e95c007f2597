import json, sys, numpy as np
for f in sys.argv[1:]:
    txt = open(f).read().rstrip().rstrip(",")
    if not txt.endswith("]"): txt += "]"
    ev = json.loads(txt)
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name" and "HorovodAllreduce" in e.get("args", {}).get("name", "")}
    req = {p: [] for p in names}; end = {p: [] for p in names}
    for e in ev:
        p = e.get("pid")
        if p not in names: continue
        if e.get("ph") == "B" and e["name"] == "NEGOTIATE_ALLREDUCE":
            req[p].append(e["ts"]); end[p].append(e["ts"])
        elif e.get("ph") in ("E", "X") and end[p]:
            end[p][-1] = max(end[p][-1], e["ts"] + e.get("dur", 0))
    pids = sorted(names)
    n = min(len(req[p]) for p in pids)
    R = np.array([req[p][:n] for p in pids]); E = np.array([end[p][:n] for p in pids])
    sl = slice(n // 3, n)
    spread = (R.max(0) - R.min(0))[sl] / 1e3
    span = (E.max(0) - R.min(0))[sl] / 1e3
    gap = (R.min(0)[1:] - E.max(0)[:-1])[sl.start:] / 1e3
    cyc = np.diff(R.min(0))[sl.start:] / 1e3
    print(f, len(pids), "tensors", n, "steps; request spread %.2f, request->last end %.2f, last end->next request %.2f, step %.2f ms (medians)" % (np.median(spread), np.median(span), np.median(gap), np.median(cyc)))
