"""The emulated cluster (benchmarks/cluster.sh): up, a 4-rank MPI job across two namespace hosts,
down, and nothing left behind (namespaces, veths, processes), also after jobs that fail or hang.

Needs root and network namespaces (ip netns, veth, bridge, tc tbf). Where they do not work the
tests FAIL (they never skip): the benchmark depends on them.
"""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "benchmarks", "cluster.sh")
HELLO = os.path.join(ROOT, "tests", "mpi", "cluster_hello.py")
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PYTHON):
    import sys
    PYTHON = sys.executable
PREFIX = f"hvdt{os.getpid() % 100000}"  # never the benchmark's "hvdc", unique per test process
ENV = dict(os.environ, HVDC_PREFIX=PREFIX, HVDC_SUBNET="10.77.1")
STATE = f"/run/hvdc-{PREFIX}"


def cluster(*args, timeout=120, check=True):
    proc = subprocess.run([CLUSTER, *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, env=ENV)
    if check and proc.returncode != 0:
        raise AssertionError(f"cluster.sh {' '.join(map(str, args))} exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}")
    return proc


def our_namespaces():
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith(PREFIX + "-")]


def netns_inodes():
    return {ns: os.stat(f"/run/netns/{ns}").st_ino for ns in our_namespaces()}


def processes_in(inodes):
    """PIDs whose network namespace is one of ``inodes``, or whose command line names our state."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            link = os.readlink(f"/proc/{pid}/ns/net")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        m = re.match(r"net:\[(\d+)\]", link)
        if (m and int(m.group(1)) in inodes) or STATE in cmd or f"{PREFIX}-h" in cmd:
            found.append((int(pid), cmd[:200]))
    return found


def assert_clean(inodes):
    assert our_namespaces() == [], f"namespaces left: {our_namespaces()}"
    links = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    left = [n for n in names if n == "cl0" or re.fullmatch(r"h\d+", n) or n.startswith(PREFIX)]
    assert left == [], f"interfaces left in the root namespace: {left}"
    assert processes_in(set(inodes.values())) == [], "processes of the harness left behind"
    assert not os.path.exists(STATE), f"state folder {STATE} left behind"


def parse_results(out):
    # several ranks' lines may share one line of mpirun's output: take every RESULT object
    return {o["rank"]: o for o in (json.loads(m) for m in re.findall(r"RESULT (\{[^}]*\})", out))}


@pytest.fixture
def two_hosts():
    cluster("down", check=False)
    up = cluster("up", 2, "200mbit")  # fails (loudly) where namespaces/veth/tc do not work
    inodes = netns_inodes()
    assert sorted(inodes) == [f"{PREFIX}-h0", f"{PREFIX}-h1", f"{PREFIX}-sw"], up.stdout
    try:
        yield inodes
    finally:
        cluster("down", check=False)


@pytest.mark.timeout(300)
def test_cluster_runs_across_hosts_and_cleans_up(two_hosts):
    status = cluster("status").stdout
    assert status.count("tbf") == 4 and "200Mbit" in status, status  # both directions, 2 links
    proc = cluster("run", "--timeout", 120, "--", PYTHON, HELLO, timeout=180)
    res = parse_results(proc.stdout)
    assert sorted(res) == [0, 1, 2, 3], proc.stdout
    assert all(r["size"] == 4 and r["sum"] == 10 for r in res.values()), res
    big = sum(sum(range(r * 1000, r * 1000 + 100000)) for r in range(4))
    assert all(r["big"] == big for r in res.values())
    hosts = [res[r]["host"] for r in range(4)]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    # ranks 0-1 and 2-3 sit on different links (different namespaces), not just different names
    assert res[0]["mac"] == res[1]["mac"] and res[0]["mac"] != res[2]["mac"], res
    cluster("down")
    assert_clean(two_hosts)
    cluster("down")  # idempotent
    assert_clean(two_hosts)


@pytest.mark.timeout(300)
def test_cluster_cleans_up_after_failed_and_hung_jobs(two_hosts):
    failed = cluster("run", "--timeout", 120, "--", PYTHON, HELLO, "--fail", timeout=180,
                     check=False)
    assert failed.returncode != 0, failed.stdout
    assert "killed after" not in failed.stdout  # the dead rank ended the job, not the timeout
    hung = cluster("run", "--timeout", 15, "--", PYTHON, HELLO, "--hang", timeout=120,
                   check=False)
    assert hung.returncode in (124, 137), hung.stdout
    assert "killed after 15s" in hung.stdout
    cluster("down")
    assert_clean(two_hosts)


@pytest.mark.timeout(120)
def test_cluster_up_failure_leaves_nothing():
    """A half-built cluster (here: the second 'up' refuses) and bad arguments leave no trace."""
    cluster("down", check=False)
    assert cluster("up", 2, "fast", check=False).returncode != 0  # bad rate: refused first
    assert our_namespaces() == []
    cluster("up", 1, "100mbit")
    inodes = netns_inodes()
    again = cluster("up", 1, "100mbit", check=False)
    assert again.returncode != 0 and "already exists" in again.stdout
    cluster("down")
    assert_clean(inodes)


@pytest.mark.timeout(400)
def test_on_a_slow_link_the_decision_compresses_from_the_second_step_and_never_passes(
        two_hosts, tmp_path):
    """5 Mbit/s between the two hosts: passing the MLP's gradients cannot take less than about
    0.1 s a step, compressing them a few ms. With the decision measuring (its default), the
    stock optimizer compresses from the second step, no step in the first 30 passes every
    tensor (float32 or float16), every rank holds the same parameters after every step, and a
    resume from step 20 runs the same candidates to the same parameters."""
    cluster("rate", "5mbit")
    out = tmp_path / "results"
    proc = cluster("run", "--timeout", 300, "--", "env", "HVDCOMP_DECISION=measure",
                   f"HVDCOMP_TEST_RESULTS={out}", PYTHON,
                   os.path.join(ROOT, "tests", "mpi", "slow_link.py"), "marsit", "topk",
                   timeout=360, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = [json.loads(line[len("RESULT "):]) for line in out.read_text().splitlines()]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    for name, ours in zip(("marsit", "topk"), ranks[0]["results"]):
        candidates = [c for c, _, _ in ours["steps"]]
        assert candidates[0] == "inf" and "inf" not in candidates[1:], (name, ours)
        assert "fp16" not in candidates, (name, ours)
        assert all(same for _, same, _ in ours["steps"]), (name, ours)
        assert ours["phase"] == "hold" and {"pass all", "pass all in fp16"} <= set(
            ours["not_run"]), (name, ours)
        assert ours["floors"]["pass all"] > 0.05, ours["floors"]
        assert ours["resumed"] == ours["steps"][20:], (name, ours)
        others = [r["results"][ranks[0]["results"].index(ours)] for r in ranks[1:]]
        assert all([c for c, _, _ in o["steps"]] == candidates for o in others)
