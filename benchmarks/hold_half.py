"""Rank script: ``regimes.py`` where a method's ``@decision=fp16`` holds the decision's float16
candidate (``hvdcomp.decision.HALF``: every tensor passed to Horovod in float16) from the first
step, which no public mode forces, so that this path can be timed against Horovod's own
``Compression.fp16`` in one job (2026-12-06: a method that chose it had run 0.92x fp16).
Benchmark-only: it patches ``Decision.observe``; fails where the candidate is not offered.

    benchmarks/cluster.sh up 2 750mbit
    benchmarks/cluster.sh run --per-host 2 --timeout 1800 -- .venv/bin/python \
        benchmarks/hold_half.py --model gpt --sequential --batch 8 --rounds 3 --steps 3 \
        --methods ceiling,hvd-fp16,SketchFusion@decision=fp16,Marsit@decision=fp16
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import hvdcomp.decision as D  # noqa: E402
import hvdcomp.facade.compressor as C  # noqa: E402

C.DECISIONS = D.MODES + ("fp16",)
measured = D.Decision.observe


def observe(self, window, numels, speak=False, steps=1, half=False, warming=None):
    if self.mode == "fp16":
        if self.thresholds is None:
            self.thresholds = D.candidates(numels, self.min_numel, half)
            assert D.HALF in self.thresholds, self.thresholds
            self.current = self.thresholds.index(D.HALF)
            self.phase = "fixed"
        return
    return measured(self, window, numels, speak, steps, half, warming)


D.Decision.observe = observe
import regimes  # noqa: E402

if __name__ == "__main__":
    regimes.main()
