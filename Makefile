# Quick start: `make demo` (set up + a 4-rank compressed training run), `make test` (set up + tests).
# Tiers (tests/conftest.py): `make unit` (in-process tests only, no MPI), `make ranks` (the tests that
# launch ranks or other processes); `make test` runs both.
# `make convergence`: every example x every compressor x 3 seeds on 4 ranks (ARGS=... passes options).
.PHONY: demo test unit ranks setup convergence
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
unit:
	bash scripts/test.sh -m unit
ranks:
	bash scripts/test.sh -m ranks
convergence: setup
	.venv/bin/python benchmarks/convergence.py $(ARGS)
