# Quick start: `make demo` (set up + a 4-rank compressed training run), `make test` (set up + tests).
# `make convergence`: every example x every compressor x 3 seeds on 4 ranks (ARGS=... passes options).
.PHONY: demo test setup convergence
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
convergence: setup
	.venv/bin/python benchmarks/convergence.py $(ARGS)
