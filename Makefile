# Thin wrapper over ./dev (which wraps Meson); see INSTALL.md.
PREFIX ?= /usr/local

.PHONY: all demo test check sanitize install clean
all:
	./dev build
demo:
	./dev demo
test check:
	./dev test
sanitize:
	./dev sanitize asan
install:
	./dev install $(PREFIX)
clean:
	rm -rf build build-asan build-ubsan build-install
