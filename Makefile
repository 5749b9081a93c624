# tokenmill -- top-level entry points. `make run` and `make test` install what they need themselves.
.PHONY: all deps deps-test build build-asan run test test-unit test-asan test-py parity goldens bench bench-serve clean

JOBS ?= $(shell nproc)
PROMPT ?= Write a haiku about a mill that grinds tokens.

all: build

deps:
	@scripts/deps.sh

deps-test:
	@scripts/deps.sh --test

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

build-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTM_SANITIZE=ON -DTM_CUDA=OFF -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
	@cmake --build build-asan -j $(JOBS)

run: build
	./build/tokenmill run --chat -p "$(PROMPT)" -n 96 --temp 0

test: deps-test build build-asan
	cd build && ctest --output-on-failure -j $(JOBS)
	cd build && TM_FORCE_SCALAR=1 ctest --output-on-failure -j $(JOBS)   # the scalar fallback kernels end to end
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)
	.deps/venv-test/bin/pytest -q tests/cli tests/server tests/bench_serve tests/sass

# Heavy oracles (HF transformers + torch, llama-cpp-python): check against them and regenerate goldens.
parity: build
	@scripts/parity.sh

bench: build
	@scripts/bench.sh

# Serving side by side: tokenmill serve vs llama.cpp's OpenAI server under the same `bench serve` load.
bench-serve: build
	@scripts/bench_serve.sh

clean:
	rm -rf build build-asan
