# specgate: `make gates` (the main job) and `make test`. Both create .venv with pinned deps.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -c1-12)
# One torch thread: deterministic, fast on 2 cores, and safe for mutmut's forked children.
export OMP_NUM_THREADS ?= 1
# Processes at once: pytest-xdist workers for `make test`, gate processes for `make gates`,
# trees for `make prove` (docs/speed.md).
JOBS ?= $(shell env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 2)
# JOBS=1: the test suite in this process (-n 0), without xdist workers.
XDIST = $(if $(filter 1,$(JOBS)),-n 0,-n $(JOBS) --dist loadgroup)

.PHONY: venv lint test prove gates gate gates-deep gates-coverage mutate viewer fixtures bench-cpu clean

venv: $(STAMP)
$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . || $(PY) -m pip install -q --no-deps -e .
	rm -f $(VENV)/.installed-*
	touch $@

# The linter (ruff, pinned; its rules are in pyproject.toml), then the suite, then the proof.
lint: venv
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest tests $(XDIST)
	$(MAKE) prove JOBS=$(JOBS)

# Plant every seeded defect in a copy of the tree: each must turn its gates red, the clean tree green.
prove: venv
	@mkdir -p reports
	$(VENV)/bin/specgate prove --jobs $(JOBS) --json reports/prove.json --markdown reports/prove.md --html reports/prove.html

# The whole decision (gates/decide.py): every gate, on the GPU when there is one (both forwards),
# with BENCH1B=1 also the 1B benchmark shape's gates there (its folder written once to
# ~/.cache/specgate/bench-models), then the veto's verdict, last: LIFT or KEEP with reasons. KEEP is
# informational (always so without CUDA); the exit status is the gates runs': a red gate fails it.
gates: venv
	@$(VENV)/bin/specgate gates decide --jobs $(JOBS) --reports reports$(if $(filter 1,$(BENCH1B)), --bench1b)

gate: venv
	@test -n "$(NAME)" || { echo "usage: make gate NAME=<gate-name>   (names: specgate gates list)"; exit 2; }
	@mkdir -p reports
	$(VENV)/bin/specgate gates run $(NAME) --json reports/gate-$(NAME).json --junit reports/gate-$(NAME).xml

gates-deep: venv
	@mkdir -p reports
	$(VENV)/bin/specgate gates run --deep --json reports/gates-deep.json --junit reports/gates-deep.xml

# Every gate under coverage.py: each gate's engine reach, reports/coverage/index.html, and the
# request-path branches no gate takes (each must be in gates/unreached-branches.toml).
gates-coverage: venv
	@mkdir -p reports
	$(VENV)/bin/specgate gates run --coverage reports/coverage --json reports/gates-coverage.json

# Mutation run: mutmut over engine/ (staged in build/mutmut/); SINCE=<rev> mutates only the
# functions changed since that revision. Reports in reports/mutation/.
mutate: venv
	$(VENV)/bin/specgate mutate --report reports/mutation $(if $(SINCE),--since $(SINCE))

# The mutation report's viewer (the pinned npm package mutation-testing-elements) into build/viewer/,
# inlined into mutation-report.html; the mutation run and tests/project/test_report_render.py also do this
# themselves when it is missing (npm, registry only).
viewer: venv
	$(PY) -m mutants.mutation.viewer

fixtures: venv
	$(PY) -m fixtures.train_target --out fixtures/target
	$(PY) -m fixtures.train_drafter --out fixtures/drafter
	$(PY) -m fixtures.manifest --write

bench-cpu: venv
	$(VENV)/bin/specgate bench --concurrency 1,8

clean:
	rm -rf $(VENV) build reports .pytest_cache .hypothesis
