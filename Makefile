# The project's two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# torch is installed first and pinned: an unpinned requirement would pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: test demo demo-rooms demo-sql demo-rag lint typecheck unit clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	touch $@

$(VENV)/.installed-test: $(VENV)/.created pyproject.toml
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[dev,torch,server,frameworks,ray,postgres,tracking,report]'
	touch $@

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests $(wildcard benchmarks examples)
	$(VENV)/bin/ruff format --check src tests $(wildcard benchmarks examples)

typecheck: $(VENV)/.installed-test
	$(VENV)/bin/mypy

# Frameworks whose pins clash with the test environment's packages (AutoGen's protobuf, CrewAI's
# openai and pydantic) run the framework matrix's agents from virtual environments of their own.
FRAMEWORKS := autogen crewai
FRAMEWORK_VENVS := $(foreach name,$(FRAMEWORKS),.frameworks/$(name)/.installed)

.frameworks/%/.installed: tests/integration/frameworks/requirements-%.txt
	rm -rf .frameworks/$*
	$(PYTHON) -m venv .frameworks/$*
	.frameworks/$*/bin/python -m pip --disable-pip-version-check -q install -r $<
	touch $@

# The AutoGen environment holds fulgor's core too (no extras: the TensorBoard one needs a newer
# protobuf than AutoGen's 5.29), so that a trainer starts its runner processes there
# (`fulgor train --runner-python .frameworks/autogen/bin/python`, examples/calc_autogen).
.frameworks/autogen/.installed: tests/integration/frameworks/requirements-autogen.txt pyproject.toml
	rm -rf .frameworks/autogen
	$(PYTHON) -m venv .frameworks/autogen
	.frameworks/autogen/bin/python -m pip --disable-pip-version-check -q install -r $< -e .
	touch $@

unit: $(VENV)/.installed-test $(FRAMEWORK_VENVS)
	$(VENV)/bin/pytest -q --durations=20 $(PYTEST_ARGS)

test: lint typecheck unit

$(VENV)/.installed-demo: $(VENV)/.created pyproject.toml
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[torch,server,frameworks,report]'
	touch $@

# The calc demo: build a tiny model, warm-start it, train it with GRPO through the whole system.
demo: $(VENV)/.installed-demo
	$(PY) -m examples.calc.train $(DEMO_ARGS)

# The rooms example: APO improves a room-booking agent's prompts (simulated model and optimiser,
# no key needed; examples/rooms/train.py runs it on any OpenAI-compatible model).
demo-rooms: $(VENV)/.installed-demo
	$(PY) -m examples.rooms.train --simulate $(DEMO_ARGS)

# The SQL example: a tiny model behind a LangGraph writer, checker and rewriter learns text-to-SQL
# with GRPO (the writer's and rewriter's calls; --agent-match all trains the checker's too,
# --adapters one LoRA adapter each for the writer and the rewriter).
demo-sql: $(VENV)/.installed-demo
	$(PY) -m examples.sql.train $(DEMO_ARGS)

# The RAG example: a tiny model behind an OpenAI Agents SDK agent learns multi-hop retrieval QA with
# GRPO, searching a made-up world's passages through an MCP server over an SQLite FTS5 index.
demo-rag: $(VENV)/.installed-demo
	$(PY) -m examples.rag.train $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .frameworks .pytest_cache .mypy_cache .ruff_cache
