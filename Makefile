# mlxcel: the README's two commands are `make serve` and `make test`.
# `setup` (scripts/setup.sh) installs what the build needs, idempotently: apt packages, the
# pinned mlx-cpu wheel in .venv, the patched mlx-sys on Linux, and the default model.

CARGO ?= cargo
SOCKET_DIR ?=

.PHONY: check-macos check-cuda setup test-setup bench-setup serve test lint build fuzz bench bench-load bench-footprint bench-throughput bench-constrained bench-agent bench-families bench-ipc bench-cachemgr bench-engine bench-serving goldens clean

setup:
	bash scripts/setup.sh

# The tests also need the openai Python SDK (in .venv).
test-setup:
	bash scripts/setup.sh --test

## serve: build (release) and run the service in the foreground under `mlxcelctl serve`: the
## cache manager, the daemon on the default model, and the HTTP front end on 127.0.0.1:8080
## (settings: ~/.config/mlxcel/config.toml, MLXCEL_* variables; SOCKET_DIR=... for the sockets).
serve: setup
	$(CARGO) build --release --workspace --bins
	./target/release/mlxcelctl serve $(if $(SOCKET_DIR),--socket-dir $(SOCKET_DIR))

## test: formatting, lints (warnings are errors), the macOS type check, every CUDA kernel compiled
## by NVRTC (no GPU needed), then every test in the workspace.
test: test-setup lint check-macos check-cuda
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

check-macos:
	CARGO=$(CARGO) bash scripts/check_macos.sh

## check-cuda: the CUDA backend without a GPU: every custom kernel's source, as MLX writes it,
## compiled for H100/H200 (sm_90a) with NVRTC from PyPI (a kernel that would not compile on a GPU
## fails here), and CUDA's padded formulation checked against the CPU's on MLX's CPU reference.
check-cuda: test-setup
	CARGO=$(CARGO) bash scripts/cuda_kernel_check.sh
	$(CARGO) test -p mlxcel-daemon --features cuda --test gpu_formulation --test packed_prefill

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p mlxcel-daemon --all-targets --features cuda -- -D warnings

build: setup
	$(CARGO) build --release --workspace --bins

## bench: measured figures (not tests).
bench: bench-cachemgr bench-engine bench-serving bench-load bench-ipc bench-footprint bench-throughput bench-constrained bench-agent bench-families

bench-cachemgr:
	$(CARGO) bench -p mlxcel-cachemgr --bench roundtrip

bench-engine: setup
	$(CARGO) bench -p mlxcel-daemon --bench engine

bench-serving: setup
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p mlxcel-daemon --bench serving

## goldens: regenerate the golden fixtures: the engine's (builds llama-cpp-python, ~5 min), the
## chat templates' with tools (Hugging Face's renderer, from the bench venv) and each
## architecture's against mlx_lm's own classes on random weights.
goldens: bench-setup
	.venv/bin/python -m pip install -q llama-cpp-python==0.3.36 jinja2 gguf numpy
	.venv/bin/python scripts/make_goldens.py
	.venv/bin/python scripts/make_goldens.py --templates
	.venv/bin/python scripts/make_arch_goldens.py

clean:
	$(CARGO) clean

## fuzz: each cargo-fuzz target for FUZZ_SECONDS (nightly; installs cargo-fuzz if missing);
## grows fuzz/corpus, which `make test` replays on stable.
FUZZ_SECONDS ?= 60
fuzz:
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

## bench-load: 64 streaming clients for LOAD_SECONDS (300) against the release stack: errors,
## throughput, latency percentiles, peak memory per process, leaked blocks, drift.
LOAD_SECONDS ?= 300
bench-load: setup
	$(CARGO) build --release --workspace --bins
	LOAD_SECONDS=$(LOAD_SECONDS) $(CARGO) bench -p mlxcel-ctl --bench load

# The peer and the charts: mlx + mlx-lm + matplotlib in .venv, and the default model exported as
# a float32 MLX directory (models/SmolLM2-135M-Instruct-mlx) for mlx_lm.server.
bench-setup: setup
	bash scripts/setup.sh --bench
	$(CARGO) build --release --workspace --bins
	test -f models/SmolLM2-135M-Instruct-mlx/model.safetensors || \
	  ./target/release/mlxcel-daemon --export-mlx models/SmolLM2-135M-Instruct-mlx

## bench-footprint / bench-throughput: mlxcel vs mlx_lm.server, results (JSON, Markdown, PNG)
## under bench/results/<time>/ (see bench/footprint.py and bench/throughput.py).
RESULTS ?= bench/results/$(shell date -u +%Y%m%d-%H%M%S)
bench-footprint: bench-setup
	.venv/bin/python bench/footprint.py --out $(RESULTS)
	.venv/bin/python bench/plot.py $(RESULTS)

bench-throughput: bench-setup
	.venv/bin/python bench/throughput.py --out $(RESULTS)
	.venv/bin/python bench/plot.py $(RESULTS)

## bench-constrained: mlxcel's tok/s with a nested JSON schema against without, at 1 and 8
## clients, and the mask time per step (bench/constrained.py).
bench-constrained: bench-setup
	.venv/bin/python bench/constrained.py --out $(RESULTS)

## bench-agent: a 10-turn tool conversation over the Messages API, prefill and TTFT per turn,
## beside mlx_lm.server's TTFT on the same conversation (bench/agent_loop.py).
bench-agent: bench-setup
	.venv/bin/python bench/agent_loop.py --out $(RESULTS)

## bench-families: each family beyond Llama (Qwen3-MoE, gpt-oss, Gemma 3) on a random-weight
## model made with mlx_lm's classes, mlxcel vs mlx_lm.server: tok/s at 1 and 8 clients, RSS.
bench-families: bench-setup
	.venv/bin/python bench/families.py --out $(RESULTS)

## bench-ipc: the same request through the full stack and straight to the daemon socket.
bench-ipc: setup
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p mlxcel-frontend --bench ipc_overhead
