# Quick start: `make demo` (set up + a 4-rank compressed training run), `make test` (set up + tests).
.PHONY: demo test setup
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
