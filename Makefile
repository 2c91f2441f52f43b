# Thin wrapper over CMake: `make`, `make test`, `make sanitize`, `make clean`.
# CMAKE_ARGS passes options to CMake, e.g. make CMAKE_ARGS="-DFORGE_CUDA_ARCH=90".
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
PREFIX ?= /usr/local

.PHONY: all test sanitize clean install

all:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

# every test: the CPU suite, and the CUDA conformance suite (skipped when no GPU is present)
test: all
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The CPU tests under AddressSanitizer and UndefinedBehaviorSanitizer (CPU backend only).
sanitize:
	cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Sanitize -DFORGE_CUDA=OFF $(CMAKE_ARGS)
	cmake --build build-san -j $(JOBS)
	ctest --test-dir build-san --output-on-failure -L cpu -j $(JOBS)

clean:
	rm -rf $(BUILD) build-san

# forge.h, libforge.a/.so, forge.pc, the CMake package and the tools under PREFIX
install: all
	cmake --install $(BUILD) --prefix $(PREFIX)
