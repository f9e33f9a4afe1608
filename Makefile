# ds41 — build, test, run.  See README.md.
CC      ?= gcc
PKGS    := jansson libpcre2-8 libutf8proc libmicrohttpd libpng libjpeg
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
# src/ is layered (README, Architecture): format < image < model < kernels < layers < dist < text < engine < store < serve < cli;
# every folder is on the include path and a file includes only headers of its own or lower layers.
SRC_DIRS := format image model kernels layers dist text engine store pd serve cli
INCLUDES := -Iinclude -Isrc $(addprefix -Isrc/,$(SRC_DIRS))
SRC_HDR  := $(wildcard $(addsuffix /*.h,$(addprefix src/,$(SRC_DIRS))) include/*.h)
# -ffp-contract=off: exact mode forbids fused multiply-add (exact-mode.md); gcc's
# default in GNU mode would fuse a*b+c once FMA is enabled.
ARCH    ?= -mavx2 -mfma -mf16c
OPT     ?= -O2
# debug information: the sanitizer build (check-asan) takes -g1, line tables only, enough for
# the file:line of its reports, and about a quarter less compile time than -g
DEBUG   ?= -g
SAN     ?=
CFLAGS  ?= $(OPT) $(DEBUG)
CFLAGS  += $(SAN) -std=gnu11 -Wall -Wextra -ffp-contract=off -fno-math-errno $(ARCH) -pthread $(INCLUDES) $(PKG_CFLAGS)
LDLIBS  += $(PKG_LIBS) -lm -pthread
# Optional: line editing and history for `ds41 chat` on a terminal with libedit (BSD licence,
# Debian libedit-dev, installed by scripts/setup.sh); without it chat reads plain lines.
EDIT_LIBS := $(shell pkg-config --libs libedit 2>/dev/null)
ifneq ($(EDIT_LIBS),)
CFLAGS  += -DDS41_HAVE_LIBEDIT
LDLIBS  += $(EDIT_LIBS)
endif
# Optional: io_uring for Engram's row prefetch (P4, src/layers/engram_io.c; Debian liburing-dev,
# installed by scripts/setup.sh); without it the rows are read with pread.
URING_LIBS := $(shell pkg-config --libs liburing 2>/dev/null)
ifneq ($(URING_LIBS),)
CFLAGS  += -DDS41_HAVE_LIBURING
LDLIBS  += $(URING_LIBS)
endif
# UCX (Debian libucx-dev): src/pd/, the prefill/decode KV transfer (docs/pd.md), is built only
# when pkg-config finds it; without it ds41 builds the rest and --role says what is missing.
UCX_LIBS := $(shell pkg-config --libs ucx 2>/dev/null)
ifneq ($(UCX_LIBS),)
CFLAGS  += -DDS41_HAVE_UCX $(shell pkg-config --cflags ucx 2>/dev/null)
LDLIBS  += $(UCX_LIBS)
endif
# MPI (docs/distributed.md): with mpicc on PATH (MPICH or Open MPI) the binary links MPI and
# runs as a rank under mpiexec; it still runs as a plain process. DS41_MPI=0 builds without.
ifneq ($(DS41_MPI),0)
MPI_CC := $(shell command -v mpicc 2>/dev/null)
endif
ifneq ($(MPI_CC),)
MPI_SHOW := $(shell mpicc -compile-info 2>/dev/null || mpicc --showme:compile 2>/dev/null)
MPI_LINK := $(shell mpicc -link-info 2>/dev/null || mpicc --showme:link 2>/dev/null)
CFLAGS  += -DDS41_HAVE_MPI $(filter -I% -D%,$(MPI_SHOW))
LDLIBS  += $(filter -L% -l% -Wl%,$(MPI_LINK))
endif
BUILD   ?= build

LIB_SRC := $(sort $(wildcard $(addsuffix /*.c,$(addprefix src/,$(SRC_DIRS)))))
LIB_SRC := $(filter-out src/cli/main.c,$(LIB_SRC))
ifeq ($(UCX_LIBS),)
LIB_SRC := $(filter-out src/pd/%.c,$(LIB_SRC))
endif
LIB_OBJ := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRC))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
ifeq ($(UCX_LIBS),)
TEST_SRC := $(filter-out tests/test_kvx_ucx.c tests/test_pd_resume.c,$(TEST_SRC))
endif
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# test helpers: programs driven by the shell tests (tests/tools/) and LD_PRELOAD fault shims (tests/faults/)
TOOL_SRC := $(sort $(wildcard tests/tools/*.c))
TOOL_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TOOL_SRC))
SHIM_SRC := $(sort $(wildcard tests/faults/*.c))
SHIM_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%.so,$(SHIM_SRC))
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all setup test run train-demo train-vision bench check-asan check-tsan fuzz clean

all: ds41 libds41.a $(TEST_BIN) $(TOOL_BIN) $(SHIM_BIN) $(BENCH_BIN)

setup:
	@bash scripts/setup.sh

$(BUILD)/obj/%.o: src/%.c $(SRC_HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libds41.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

libds41.a: $(BUILD)/libds41.a
	@if [ "$(BUILD)" = build ]; then cp $< $@; fi

$(BUILD)/ds41: src/cli/main.c $(BUILD)/libds41.a
	$(CC) $(CFLAGS) $< $(BUILD)/libds41.a -o $@ $(LDFLAGS) $(LDLIBS)

ds41: $(BUILD)/ds41
	@if [ "$(BUILD)" = build ]; then cp $< $@; fi

$(BUILD)/tests/%: tests/%.c $(BUILD)/libds41.a tests/check.h tests/testutil.h tests/malformed.h $(wildcard tests/tools/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libds41.a -o $@ $(LDFLAGS) $(LDLIBS)

# a shim is loaded into other programs: no sanitizer flags (it must not need their runtime)
$(BUILD)/tests/faults/%.so: tests/faults/%.c Makefile
	@mkdir -p $(dir $@)
	$(CC) -O2 -g -Wall -Wextra -fPIC -shared $< -o $@ -ldl

$(BUILD)/bench/%: bench/%.c $(BUILD)/libds41.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(BUILD)/libds41.a -o $@ $(LDFLAGS) $(LDLIBS)

# make test: install what is missing, build, run every test; last line "N passed, N failed".
# builds use every core (JOBS=1 for a sequential build)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

test: setup
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash tests/run.sh

# make run: the main job (see README).
run: setup
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash scripts/run.sh

# make train-demo: train models/demo's language model from the Debian packages (one epoch by default, about 6
# hours on 2 cores, resumable: MINUTES=60 make train-demo trains for an hour and saves;
# tools/train/README.md). Not part of make test.
train-demo:
	@DS41_SETUP_TRAIN=1 bash scripts/setup.sh
	@$(MAKE) --no-print-directory all
	@bash tools/train/run.sh

# make train-vision: teach models/demo (whatever it holds: run it after the text model is final)
# to answer questions about generated scenes; resumable (MINUTES=M, FRESH=1), writes the candidate
# to build/demo-vision/model, INSTALL=1 copies it into models/demo (tools/train/README.md).
train-vision:
	@DS41_SETUP_TRAIN=1 bash scripts/setup.sh
	@$(MAKE) --no-print-directory all
	@bash tools/train/vision_run.sh

bench: setup
	@$(MAKE) --no-print-directory all
	@bash bench/run.sh

# AddressSanitizer + UndefinedBehaviorSanitizer build of everything, then the C and CLI tests.
# The test binaries of the programs that the sanitizer pass skips (tests/asan-skip, which
# tests/run.sh reads too) are not built there; DS41_ASAN_SKIP="" builds and runs them all.
ifeq ($(origin DS41_ASAN_SKIP),undefined)
ASAN_SKIP := $(shell sed 's/\#.*//' tests/asan-skip 2>/dev/null)
else
ASAN_SKIP := $(DS41_ASAN_SKIP)
endif
ASAN_TEST_BIN := $(filter-out $(addprefix $(BUILD)/tests/,$(ASAN_SKIP)),$(TEST_BIN))
check-asan:
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build-asan OPT=-O1 DEBUG=-g1 \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" build-asan/ds41 $(patsubst $(BUILD)/%,build-asan/%,$(ASAN_TEST_BIN) $(TOOL_BIN) $(SHIM_BIN))
	@DS41_BUILD=build-asan DS41_ASAN=1 bash tests/run.sh

# ThreadSanitizer build of ./ds41 (clang; TSAN_CC=gcc works too), then the server under
# concurrent load (tests/serve.test.sh with DS41_SERVE_TSAN=1: 16 concurrent streams, the
# malformed corpus, slow and vanishing clients, shutdown); clean = no ThreadSanitizer report.
TSAN_CC ?= clang
check-tsan:
	@$(MAKE) --no-print-directory CC=$(TSAN_CC) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=thread" build-tsan/ds41
	@DS41=$(CURDIR)/build-tsan/ds41 DS41_SERVE_TSAN=1 TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1" \
	  bash tests/serve.test.sh >build-tsan/serve-tsan.log 2>&1; grep -E '^(PASS|FAIL)' build-tsan/serve-tsan.log; \
	  p=$$(grep -c '^PASS' build-tsan/serve-tsan.log); f=$$(grep -c '^FAIL' build-tsan/serve-tsan.log); \
	  echo "$$p passed, $$f failed"; [ "$$f" -eq 0 ] && [ "$$p" -gt 0 ]

FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_BIN := $(patsubst fuzz/%.c,build-fuzz/%,$(FUZZ_SRC))
FUZZ_SECONDS ?= 20
# The sources the harnesses link (the parsers: chat, config, safetensors header, store
# records, HTTP requests, tokenizer; a harness that needs another object fails to link, so
# the list cannot silently fall behind) are compiled once with coverage instrumentation
# (fuzzer-no-link) and archived; compiling only these, not the whole library (kernels,
# forward, CLI), takes the fuzz smoke run of make test from about 200 s to 60 s on 2 cores.
# UB aborts (no recover) so that the fuzzer sees it as a crash.
FUZZ_CFLAGS := -O1 -g1 -std=gnu11 -ffp-contract=off $(ARCH) -pthread $(INCLUDES) $(PKG_CFLAGS) \
  -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LIB_SRC := $(addprefix src/,format/common.c format/formats.c format/safetensors.c model/config.c model/contract.c \
  text/chat.c text/chat_json.c text/tokenizer.c text/tokenizer_load.c store/crc32c.c store/pstore.c store/kvx_frame.c store/kvx_resume.c \
  text/grammar.c text/grammar_json.c text/grammar_match.c text/grammar_regex.c text/grammar_tables.c text/grammar_memo.c \
  serve/serve_req.c serve/serve_text.c serve/serve_anth.c serve/serve_resp.c dist/dist_place.c \
  image/img_decode.c image/img_png.c image/img_jpeg.c image/img_plan.c image/img_resize.c image/img_prep.c \
  serve/serve_mpi_wire.c dist/dist_stage.c)
FUZZ_OBJ := $(patsubst src/%.c,build-fuzz/obj/%.o,$(FUZZ_LIB_SRC))
build-fuzz/obj/%.o: src/%.c $(SRC_HDR)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
build-fuzz/libds41.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^
build-fuzz/fuzz_%: fuzz/fuzz_%.c build-fuzz/libds41.a
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $< build-fuzz/libds41.a -o $@ $(PKG_LIBS) -lm -pthread
fuzz: $(FUZZ_BIN)
	@bash fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan build-tsan build-fuzz ds41 libds41.a
