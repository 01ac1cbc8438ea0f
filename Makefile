# ustrain build. `make` builds ./ustrain (C11, -Wall -Wextra -Werror). `make test` runs the suite.
# Sources are found by wildcard: core/*.c and parallel/*.c form build/libustrain.a, cmd/*.c the
# binary, every test/test_*.c a test program linked against the library.

CC      ?= gcc
OPT     ?= -O3 -march=native
CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wno-format-truncation \
           -fopenmp -pthread \
           -I. -Icore -Iparallel -I/usr/include/x86_64-linux-gnu/openblas-openmp \
           $(shell pkg-config --cflags yaml-0.1 libcjson pmix 2>/dev/null) $(EXTRA_CFLAGS)
OBLAS   := /usr/lib/x86_64-linux-gnu/openblas-openmp
LDLIBS  := -L$(OBLAS) -Wl,-rpath,$(OBLAS) -lopenblas -lyaml -lcjson -lpmix -lm -lrt -fopenmp -pthread
LDFLAGS ?= $(EXTRA_LDFLAGS)

LIB_SRC := $(sort $(wildcard core/*.c parallel/*.c))
CMD_SRC := $(sort $(wildcard cmd/*.c))
TEST_SRC:= $(sort $(wildcard test/test_*.c))
B       ?= build
LIB_OBJ := $(LIB_SRC:%.c=$(B)/%.o)
CMD_OBJ := $(CMD_SRC:%.c=$(B)/%.o)
TESTS   := $(TEST_SRC:test/%.c=$(B)/test/%)

.PHONY: all deps test demo bench clean format

all: ustrain $(TESTS)

deps:
	@scripts/install-deps.sh

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(B)/libustrain.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

ustrain: $(CMD_OBJ) $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $(CMD_OBJ) $(B)/libustrain.a $(LDLIBS)

$(B)/test/%: $(B)/test/%.o $(B)/libustrain.a
	$(CC) $(LDFLAGS) -o $@ $< $(B)/libustrain.a $(LDLIBS)

# The README's test command: installs what is missing, builds everything, runs every test.
test: deps
	$(MAKE) all
	test/run.sh

# The README's main job: the bundled tiny default on CPU (writes the demo data when missing).
demo: deps
	$(MAKE) ustrain
	@[ -f data/tiny/train_000.bin ] || ./ustrain data demo data/tiny
	./ustrain train configs/tiny.yaml

bench: deps
	$(MAKE) ustrain
	./ustrain bench train configs/bench-gpt2-124m.yaml

format:
	clang-format -i $(LIB_SRC) $(CMD_SRC) $(TEST_SRC) $(wildcard core/*.h parallel/*.h test/*.h)

clean:
	rm -rf build ustrain

-include $(LIB_OBJ:.o=.d) $(CMD_OBJ:.o=.d) $(TESTS:%=%.d)
