# mlxcel: the README's two commands are `make serve` and `make test`.
# Every target installs what it needs itself (see scripts/ as later work adds engine setup).

CARGO ?= cargo
SOCKET_DIR ?=

.PHONY: serve test lint build bench clean

## serve: build (release) and run the service in the foreground. For now this is the cache
## manager alone; the daemon and HTTP front end join it as they land.
serve:
	$(CARGO) build --release --workspace --bins
	./target/release/mlxcel-cachemgr $(if $(SOCKET_DIR),--socket-dir $(SOCKET_DIR))

## test: formatting, lints (warnings are errors), then every test in the workspace.
test: lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

build:
	$(CARGO) build --release --workspace --bins

## bench: measured figures (not tests): cache manager round trips over its real socket.
bench:
	$(CARGO) bench -p mlxcel-cachemgr --bench roundtrip

clean:
	$(CARGO) clean
