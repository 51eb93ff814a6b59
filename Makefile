# iopace: `make demo` serves the embedded default and drives it with fio;
# `make test` runs every test. Both install what is missing first.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: all setup build release test lint demo clean install man

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
	timeout --signal=KILL 1500 $(CARGO) test --workspace --no-fail-fast -- --test-threads=2

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

demo: release
	@scripts/demo.sh

# `make install` (PREFIX=/usr/local, DESTDIR for staging): the binary, its
# man page, bash/zsh/fish completions and the systemd unit (not enabled).
PREFIX ?= /usr/local
BIN := $(or $(CARGO_TARGET_DIR),target)/release/iopace
install: release
	install -Dm755 $(BIN) $(DESTDIR)$(PREFIX)/bin/iopace
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	$(BIN) manpage > $(DESTDIR)$(PREFIX)/share/man/man1/iopace.1
	$(BIN) completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/iopace
	$(BIN) completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_iopace
	$(BIN) completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/iopace.fish
	sed 's|/usr/local/bin/iopace|$(PREFIX)/bin/iopace|' contrib/iopace.service > iopace.service.tmp
	install -Dm644 iopace.service.tmp $(DESTDIR)$(PREFIX)/lib/systemd/system/iopace.service
	rm -f iopace.service.tmp

# docs/iopace.1 is the generated man page, kept in the tree for readers.
man: release
	$(BIN) manpage > docs/iopace.1

clean:
	$(CARGO) clean
