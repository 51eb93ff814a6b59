# iopace: `make demo` serves the embedded default and drives it with fio;
# `make test` runs every test. Both install what is missing first.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: all setup build release test lint demo clean

all: release

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --workspace

release: setup
	$(CARGO) build --release -p iopace

test: setup
	$(CARGO) build --workspace --all-targets
	# A hung test fails CI in minutes rather than hours.
	timeout --signal=KILL 1500 $(CARGO) test --workspace -- --test-threads=2

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

demo: release
	@scripts/demo.sh

clean:
	$(CARGO) clean
