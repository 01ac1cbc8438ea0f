# ustrain build. `make` builds ./ustrain (C11, -Wall -Wextra -Werror). `make test` runs the suite.
# Sources are found by wildcard: the .c files under core/ and parallel/ form build/libustrain.a,
# cmd/*.c the binary, every test/test_*.c a test program linked against the library.

# ---- the layers (docs/architecture.md) ---------------------------------------------------------
# The one table of the layering, bottom to top. A unit is a folder or a file stem (folder/stem);
# a file belongs to the unit that names it most closely. A file may include and call only its own
# layer and those before it: each folder is compiled with include paths for the folders of its
# layer and below only (so most upward includes do not compile), and test/tools/layering.py checks
# every object's .d dependencies and nm undefined symbols against this table (`make layers`
# prints it). cuda/ is the GPU backend of core/base/ops.h: only core/base/ops.c (ops_create) and
# the tools may reach it. The model never talks to parallel/comm itself: tp/cp/ep do it for it.
LAYERS      := base io comm split model wrap train tools
LAYER_base  := core/base
LAYER_io    := core/io
LAYER_comm  := parallel/comm
LAYER_split := parallel/tp parallel/cp parallel/ep
LAYER_model := core/model
LAYER_wrap  := parallel/dp parallel/dp_io parallel/dp_internal parallel/dp_muon parallel/dp_stats parallel/pp parallel/pp_schedule \
               parallel/pp_schedule_check
LAYER_train := core/train
LAYER_tools := core/tools cmd cuda/bench_gpu
LAYER_NEVER := model:comm
BACKEND     := cuda
# the folders each layer's units live in, those of a layer and every layer below it, and the
# highest layer of each folder (whose list its files are compiled with)
unit_dir     = $(if $(wildcard $(1)/.),$(1),$(patsubst %/,%,$(dir $(1))))
$(foreach L,$(LAYERS),$(eval LAYER_DIRS_$L := $(sort $(foreach u,$(LAYER_$L),$(call unit_dir,$u)))))
_upto :=
$(foreach L,$(LAYERS),$(eval _upto += $(filter-out $(_upto),$(LAYER_DIRS_$L)))$(eval DIRS_UPTO_$L := $(_upto)))
$(foreach L,$(LAYERS),$(foreach d,$(LAYER_DIRS_$L),$(eval TOP_$d := $L)))
ALL_DIRS    := $(DIRS_UPTO_tools)
# dir_inc DIR: the include flags of DIR's sources (itself first); test/ sees everything
dir_inc      = -I$(1) $(addprefix -I,$(filter-out $(1),$(if $(TOP_$(1)),$(DIRS_UPTO_$(TOP_$(1))),. $(ALL_DIRS))))
.PHONY: layers
layers:
	@$(foreach L,$(LAYERS),echo "$L: $(LAYER_$L)";) echo "never: $(LAYER_NEVER)"; echo "backend: $(BACKEND)"

CC      ?= gcc
OPT     ?= -O3 -march=native
# -fno-math-errno: nothing reads errno after a math call, and without it sqrtf's errno path
# keeps loops such as AdamW's from vectorizing (bit-identical results: sqrt and division are
# correctly rounded either way; ISO C mode keeps FMA contraction off).
CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wpointer-arith -Wno-format-truncation \
           -fno-math-errno -fopenmp -pthread \
           -I/usr/include/x86_64-linux-gnu/openblas-openmp \
           $(shell pkg-config --cflags yaml-0.1 libcjson pmix 2>/dev/null) $(EXTRA_CFLAGS)
OBLAS   := /usr/lib/x86_64-linux-gnu/openblas-openmp
LDLIBS  := -L$(OBLAS) -Wl,-rpath,$(OBLAS) -lopenblas -lyaml -lcjson -lutf8proc -lpmix -lzstd -lz -lcrypto -lm -lrt -fopenmp -pthread
LDFLAGS ?= $(EXTRA_LDFLAGS)
# gloo (Debian's libgloo-dev), for CPU groups across nodes: with gloo/context.h found and GLOO != 0,
# parallel/comm/gloo_store.cc (the only C++ in parallel/: gloo's Store over the bootstrap, the TCP
# device and the collectives behind plain C functions) is compiled with $(CXX) into the library,
# C code gets -DUST_GLOO (parallel/comm/comm_gloo.c) and the binary links -lgloo -lstdc++.
GLOO_H  := $(wildcard /usr/include/gloo/context.h)
GLOO    ?= $(if $(GLOO_H),1,0)
ifeq ($(GLOO),1)
CFLAGS  += -DUST_GLOO
LDLIBS  += -lgloo -lstdc++
endif

LIB_SRC := $(sort $(wildcard $(addsuffix /*.c,$(filter core/% parallel parallel/%,$(ALL_DIRS)))))
CMD_SRC := $(sort $(wildcard cmd/*.c))
TEST_SRC:= $(sort $(wildcard test/test_*.c))
B       ?= build
LIB_OBJ := $(LIB_SRC:%.c=$(B)/%.o)
CMD_OBJ := $(CMD_SRC:%.c=$(B)/%.o)
TESTS   := $(TEST_SRC:test/%.c=$(B)/test/%)

.PHONY: all deps venv test test-asan demo bench clean format

# BIN: where the binary goes (other build directories, e.g. the sanitizer build, keep their own)
BIN     ?= ustrain

all: $(BIN) $(TESTS)

deps:
	@scripts/install-deps.sh

# the tests' Python environment (.venv: test/requirements.txt, pinned; cached outside the clone)
venv:
	@scripts/venv.sh

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(call dir_inc,$(patsubst %/,%,$(dir $<))) $(EXTRA_INC) -MMD -MP -c $< -o $@
# the backend factory is the one library file that names cuda/
$(B)/core/base/ops.o: EXTRA_INC := -I$(BACKEND)

$(B)/libustrain.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

ifeq ($(GLOO),1)
GLOO_OBJ := $(B)/parallel/comm/gloo_store.o
$(GLOO_OBJ): parallel/comm/gloo_store.cc
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(OPT) -g -Wall -Wextra -Werror -pthread $(call dir_inc,parallel/comm) -MMD -MP -c $< -o $@
$(B)/libustrain.a: $(GLOO_OBJ)
-include $(GLOO_OBJ:.o=.d)
endif

$(BIN): $(CMD_OBJ) $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $(CMD_OBJ) $(B)/libustrain.a $(LDLIBS)

$(B)/test/%: $(B)/test/%.o $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $< $(B)/libustrain.a $(LDLIBS)

# The README's test command: installs what is missing (Debian packages, the Python environment),
# builds everything, runs every test.
test: deps venv
	$(MAKE) -j$$(nproc) all
	test/run.sh

# The whole suite on an AddressSanitizer + UndefinedBehaviorSanitizer build (CPU only), in its own
# build directory with its own binary; any sanitizer report fails the test that triggered it.
ASAN_OPT := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
test-asan: deps venv
	$(MAKE) -j$$(nproc) B=build-asan BIN=build-asan/ustrain CUDA=0 OPT="$(ASAN_OPT)" \
	    EXTRA_LDFLAGS="-fsanitize=address,undefined" all
	BUILD=build-asan UST=build-asan/ustrain ASAN_OPTIONS=detect_leaks=0 test/run.sh

# The README's main job: the bundled tiny default on CPU (writes the demo data when missing).
demo: deps
	$(MAKE) ustrain
	@[ -f data/tiny/train_000.bin ] || ./ustrain data demo data/tiny
	./ustrain train configs/tiny.yaml

bench: deps
	$(MAKE) ustrain
	@[ -f data/tiny/train_000.bin ] || ./ustrain data demo data/tiny
	./ustrain bench train configs/bench-gpt2-124m.yaml
	./ustrain bench attention
	scripts/bench-dp.sh
	scripts/bench-tp.sh
	scripts/bench-cp.sh
	scripts/bench-window.sh
	scripts/bench-latent.sh
	scripts/bench-pp.sh
	scripts/bench-packing.sh
	scripts/bench-moe.sh
	scripts/bench-ckpt.sh
	scripts/bench-muon.sh
	scripts/bench-trace.sh
	OMP_WAIT_POLICY=PASSIVE ./ustrain bench generate configs/gpt2-124m.yaml --new-tokens 64
	scripts/bench-contention.sh ./ustrain $(UST_BASE)

format:
	clang-format -i $(LIB_SRC) $(CMD_SRC) $(TEST_SRC) $(wildcard $(addsuffix /*.h,$(ALL_DIRS)) test/*.h)

clean:
	rm -rf build build-emu ustrain

-include $(LIB_OBJ:.o=.d) $(CMD_OBJ:.o=.d) $(TESTS:%=%.d)

# ---- CUDA backend (cuda/*.cu) ------------------------------------------------------------------
# With nvcc found (/usr/local/cuda/bin/nvcc or on PATH) and CUDA != 0, cuda/*.cu are linked into
# the backend plugin $(B)/libustrain_cuda.so (with cudart, cuBLAS and cuBLASLt, dynamically), C
# code gets -DUST_CUDA, and cuda/ops_cuda_load.c in the library dlopens the libraries and the
# plugin when a CUDA backend is made: no binary links a CUDA library, so a CUDA build runs CPU
# configs on machines without a GPU, driver or CUDA libraries (docs/gpu.md). The plugin calls
# back the binary's ust_errf, ust_fatal and ust_assert_fail (exported for it). `make CUDA=0`
# builds CPU-only. CUDA_ARCH lists SM versions (default 80 90; PTX of the last is embedded too).
# NCCL lines that test $(CUDA) belong after this block.
NVCC      ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(NVCC),)
CUDA      ?= 0
else
CUDA      ?= 1
endif
ifneq ($(CUDA),0)
ifeq ($(NVCC),)
$(error CUDA=$(CUDA) but nvcc was not found; install the CUDA toolkit or build with CUDA=0)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= 80 90
CUDA_GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_GENCODE) -Xcompiler -fPIC,-Wall -Icuda -Icore/base
CU_SRC    := $(sort $(wildcard cuda/*.cu))
CU_OBJ    := $(CU_SRC:%.cu=$(B)/%.o)
CUDA_MAJOR := $(shell $(NVCC) --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
CFLAGS    += -DUST_CUDA
LDLIBS    += -ldl $(foreach f,ust_errf ust_fatal ust_assert_fail,-Wl,--export-dynamic-symbol=$(f))

# the plugin's objects: only ust_cuda_plugin_v1 (cuda/cuda_plugin.cu) is visible outside it
$(B)/cuda/%.o: cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fvisibility=hidden -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

all: $(B)/libustrain_cuda.so
$(B)/libustrain_cuda.so: $(CU_OBJ)
	$(CXX) -shared -o $@ $(CU_OBJ) -Wl,-Bsymbolic -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart
$(B)/libustrain.a: $(B)/cuda/ops_cuda_load.o
$(B)/cuda/ops_cuda_load.o: EXTRA_INC := -DUST_CUDA_PLUGIN_PATH='"$(abspath $(B))/libustrain_cuda.so"'
$(B)/core/base/dynlib.o: EXTRA_INC := -DUST_CUDA_HOME='"$(CUDA_HOME)"' -DUST_CUDA_MAJOR=$(CUDA_MAJOR)

# GPU benchmark of the model's forward+backward (scripts/gpu-check.sh runs it)
all: $(B)/bench_gpu
$(B)/bench_gpu: $(B)/cuda/bench_gpu.o $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $< $(B)/libustrain.a $(LDLIBS)

-include $(CU_OBJ:.o=.d) $(B)/cuda/bench_gpu.d $(B)/cuda/ops_cuda_load.d
endif
# Objects built with and without CUDA differ (-DUST_CUDA, -DUST_NCCL, the archive's members): a
# stamp that changes with the choice makes switching between `make` and `make CUDA=0` in one
# build directory rebuild them (and so the archive) instead of linking stale ones. The C flags
# are part of it too: a changed flag rebuilds what it compiles.
CUDA_STAMP      := $(B)/cuda-config.stamp
CUDA_STAMP_TEXT := CUDA=$(CUDA) NCCL=$(NCCL) EMU=$(EMU) GLOO=$(GLOO) CFLAGS=$(CFLAGS)
$(shell mkdir -p $(B) && [ "$$(cat $(CUDA_STAMP) 2>/dev/null)" = "$(CUDA_STAMP_TEXT)" ] || echo "$(CUDA_STAMP_TEXT)" > $(CUDA_STAMP))
$(LIB_OBJ) $(CMD_OBJ) $(TESTS:%=%.o) $(GLOO_OBJ): $(CUDA_STAMP)
# ---- end of the CUDA backend block -------------------------------------------------------------

# ---- the emulator build (make emu) -------------------------------------------------------------
# build-emu/: the whole project with cuda/*.cu compiled as C++ against the CPU emulator in cuda/emu
# (kernels, cuBLAS/cuBLASLt, the runtime with streams, events and guarded device memory, NCCL over
# shared memory), so run.device=cuda and the NCCL backend run on machines without a GPU. It checks
# logic (test/sh/gpu_emulated.sh), never speed or hardware behaviour. Needs g++.
.PHONY: emu
emu:
	$(MAKE) B=build-emu BIN=build-emu/ustrain CUDA=0 NCCL=0 EMU=1 OPT="-O1" all
ifeq ($(EMU),1)
CXX       ?= g++
CFLAGS    += -DUST_CUDA -DUST_NCCL -DUST_CUDA_EMU -Icuda/emu/include
# linked in directly: no plugin (cuda_plugin.cu) and no library to dlopen
EMU_CU    := $(filter-out cuda/cuda_plugin.cu,$(sort $(wildcard cuda/*.cu)))
EMU_OBJ   := $(EMU_CU:%.cu=$(B)/%.o) $(B)/cuda/emu/emu_rt.o $(B)/cuda/emu/emu_strict.o \
             $(B)/cuda/ops_cuda_load.o
EMU_CXX   := $(CXX) -std=c++17 $(OPT) -g -MMD -MP
.PRECIOUS: $(B)/cuda/%.cpp
$(B)/cuda/%.cpp: cuda/%.cu cuda/emu/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 cuda/emu/cu2cpp.py $< $@
# cuda_internal.h has launches too (ACT_LAUNCH): its converted copy sits beside the .cpp files,
# where their #include "cuda_internal.h" finds it first.
$(B)/cuda/cuda_internal.h: cuda/cuda_internal.h cuda/emu/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 cuda/emu/cu2cpp.py $< $@
# the kernels call emu_strict.cpp before every memory access (its strict mode, EMU_STRICT=1)
EMU_TSAN  := -fsanitize=thread --param=tsan-instrument-func-entry-exit=0
$(B)/cuda/%.o: $(B)/cuda/%.cpp $(B)/cuda/cuda_internal.h
	$(EMU_CXX) $(EMU_TSAN) -w -Icuda/emu/include -Icuda -Icore/base -c $< -o $@
$(B)/cuda/emu/%.o: cuda/emu/%.cpp
	@mkdir -p $(dir $@)
	$(EMU_CXX) -Wall -Wextra -Werror -c $< -o $@
$(B)/libustrain.a: $(EMU_OBJ)
LDLIBS    += -lstdc++
all: $(B)/bench_gpu
$(B)/bench_gpu: $(B)/cuda/bench_gpu.o $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $< $(B)/libustrain.a $(LDLIBS)
-include $(EMU_OBJ:.o=.d) $(B)/cuda/bench_gpu.d
# the fp-contract mode (make emu-fma): the kernels again at -O2 with -ffp-contract=fast -mfma, so
# a*b+c rounds once as nvcc's default --fmad=true makes it on a GPU, and test_cuda_ops linked with
# them (they come before the archive, whose own kernel objects then stay out)
EMU_FMA_OBJ := $(EMU_CU:cuda/%.cu=$(B)/fma/%.o)
$(B)/fma/%.o: $(B)/cuda/%.cpp $(B)/cuda/cuda_internal.h
	@mkdir -p $(dir $@)
	$(EMU_CXX) -O2 -ffp-contract=fast -mfma -w -Icuda/emu/include -Icuda -Icore/base -c $< -o $@
$(B)/fma/test_cuda_ops: $(B)/test/test_cuda_ops.o $(EMU_FMA_OBJ) $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $< $(EMU_FMA_OBJ) $(B)/libustrain.a $(LDLIBS)
-include $(EMU_FMA_OBJ:.o=.d)
endif
.PHONY: emu-fma
emu-fma: emu
	$(MAKE) B=build-emu BIN=build-emu/ustrain CUDA=0 NCCL=0 EMU=1 OPT="-O1" build-emu/fma/test_cuda_ops

# ---- NCCL communicator backend (parallel/comm/comm_nccl.c) ------------------------------------------
# Compiled when nccl.h is found (CUDA toolkit or system) unless CUDA=0 or NCCL=0: C code gets
# -DUST_NCCL; libnccl.so.2 and cudart are dlopened when the first NCCL context is made
# (parallel/comm/nccl_api.c), so the binary runs CPU configs without them, a GPU or a driver.
NCCL_HOME ?= /usr/local/cuda
NCCL_H    := $(firstword $(wildcard $(NCCL_HOME)/include/nccl.h /usr/include/nccl.h))
NCCL      ?= $(if $(NCCL_H),$(if $(filter 0,$(CUDA)),0,1),0)
ifeq ($(NCCL),1)
CFLAGS    += -DUST_NCCL -I$(dir $(NCCL_H)) -I$(NCCL_HOME)/include
endif

# `ustrain bench comm` at 2, 4 and 8 ranks under scripts/ustrun, with OpenMPI's MPI_Allreduce
# measured in the same run (needs mpicc/mpirun; not part of `make` or the tests).
.PHONY: bench-comm
bench-comm: ustrain
	scripts/bench-comm.sh ./ustrain $(B)

# The long fuzz run (test/sh/fuzz_short.sh is the short one in `make test`): every libFuzzer
# target of test/fuzz, built with clang + ASan + UBSan in build-fuzz/, for FUZZ_SECONDS each.
# Crashing inputs are kept in build-fuzz/artifacts/ (see test/fuzz/run.sh).
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz:
	@UST_EXTRA_PKGS="clang libclang-rt-dev" scripts/install-deps.sh
	test/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

# Only the Hugging Face tests (export, import, generate, eval, each against transformers itself);
# `make test` runs them too.
.PHONY: test-hf
test-hf: venv ustrain
	@for t in export_hf hf_import hf_families hf_windows hf_olmo2 hf_gemma3 hf_gemma2 export_complete generate eval_cli; do bash test/sh/$$t.sh; done
