#!/bin/sh
# tests/test-install.sh BUILD_DIR SOURCE_DIR - the installed library as another program sees it:
#  1. cmake --install into a temporary prefix (what `make install PREFIX=...` runs);
#  2. examples/simple.c compiled as C99 against it with `cc -std=c99 $(pkg-config --cflags --libs
#     forge)`, run on tests/fixtures/tiny-qwen2 (a tiny Qwen2 with a real tokenizer): it generates,
#     trains a LoRA for a few steps (the loss must fall) and saves a PEFT adapter;
#  3. the same program linked statically (pkg-config --static) and through find_package(forge);
#  4. nm -D on libforge.so: only forge_ symbols are exported.
set -eu
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
CC=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/forge-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-install: $*" >&2; exit 1; }
for t in "$CC" pkg-config nm ldd cmake; do command -v "$t" > /dev/null || fail "$t is not installed"; done

# 1. install
cmake --install "$BUILD" --prefix "$tmp/prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install failed"; }
pc=$(find "$tmp/prefix" -name forge.pc | head -n 1)
[ -n "$pc" ] || fail "no forge.pc installed"
libdir=$(dirname "$(dirname "$pc")")
[ -f "$tmp/prefix/include/forge.h" ] || fail "forge.h not installed"
[ -f "$libdir/libforge.a" ] || fail "libforge.a not installed in $libdir"
so=$(find "$libdir" -name 'libforge.so.*.*.*' | head -n 1)
[ -n "$so" ] && [ -e "$libdir/libforge.so" ] || fail "libforge.so not installed in $libdir"
[ -f "$libdir/cmake/forge/forgeConfig.cmake" ] || fail "forgeConfig.cmake not installed"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion forge)" = "$(sed -n 's/^#define FORGE_VERSION "\(.*\)"/\1/p' "$SRC/forge.h")" ] ||
    fail "pkg-config version $(pkg-config --modversion forge) is not forge.h's FORGE_VERSION"

# 2. simple.c against the shared library, found through pkg-config
$CC -std=c99 -Wall -Wextra -pedantic -Werror "$SRC/examples/simple.c" $(pkg-config --cflags --libs forge) -o "$tmp/simple" ||
    fail "examples/simple.c does not compile against the installed library"
check_run() { # $1: program, $2: adapter dir
    LD_LIBRARY_PATH="$libdir" "$1" "$SRC/tests/fixtures/tiny-qwen2" "$2" cpu > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "$1 failed"; }
    grep -q '^before: ' "$tmp/out.txt" && grep -q '^after: ' "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "$1 did not generate"; }
    first=$(sed -n 's/^step 1: loss //p' "$tmp/out.txt")
    last=$(sed -n 's/^step 5: loss //p' "$tmp/out.txt")
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b < a) }' || { cat "$tmp/out.txt"; fail "$1: the loss did not fall ($first -> $last)"; }
    [ -s "$2/adapter_config.json" ] && [ -s "$2/adapter_model.safetensors" ] || fail "$1 did not save the adapter in $2"
}
check_run "$tmp/simple" "$tmp/adapter-shared"
cat "$tmp/out.txt"
ldd "$tmp/simple" | grep -q "libforge.so" || fail "simple is not linked to libforge.so"

# 3. statically, and through the CMake package
$CC -std=c99 "$SRC/examples/simple.c" $(pkg-config --cflags forge) "$libdir/libforge.a" \
    $(pkg-config --static --libs forge | sed 's/-lforge\b//') -o "$tmp/simple-static" ||
    fail "examples/simple.c does not link statically with pkg-config --static"
ldd "$tmp/simple-static" | grep -q "libforge.so" && fail "simple-static uses libforge.so"
check_run "$tmp/simple-static" "$tmp/adapter-static"
mkdir "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.22)
project(consumer C)
find_package(forge 0.1 REQUIRED)
add_executable(simple "$SRC/examples/simple.c")
target_link_libraries(simple PRIVATE forge::forge)
EOF
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/consumer.log" 2>&1 &&
    cmake --build "$tmp/consumer/build" >> "$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "find_package(forge) consumer does not build"; }
check_run "$tmp/consumer/build/simple" "$tmp/adapter-cmake"

# 4. the dynamic symbol table: forge_ only
bad=$(nm -D --defined-only "$so" | awk '{ print $NF }' | grep -v '^forge_' || true)
[ -z "$bad" ] || fail "libforge.so exports symbols other than forge_*: $(echo "$bad" | head -n 10 | tr '\n' ' ')"
n=$(nm -D --defined-only "$so" | grep -c ' forge_')
echo "test-install: ok ($n forge_ symbols exported, shared, static and CMake-package builds of simple.c ran)"
