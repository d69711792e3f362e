# Builds the C runtime (libtpurt.a), its C tests, and the PyTorch bridge
# (torch_tpu/_C.so). Incremental: each source recompiles only when it or a
# header it includes changes (-MMD dependency files).
PYTHON ?= .venv/bin/python
# Importing torch must not autoload torch_tpu while torch_tpu is being built.
export TORCH_DEVICE_BACKEND_AUTOLOAD = 0
BUILD  ?= build
CC     ?= gcc
CXX    ?= g++

CFLAGS_BASE := -std=c11 -O2 -g -fPIC -Wall -Wextra -Wno-unused-parameter -pthread \
               -D_GNU_SOURCE -Iruntime/include -Iruntime -MMD -MP
CFLAGS ?=
# Extra flags for the bridge's compile and link (scripts/sanitize.sh passes sanitizers here).
CXXFLAGS ?=
LDFLAGS ?=
# Where the bridge is linked; scripts/sanitize.sh links a sanitized one elsewhere.
SO ?= torch_tpu/_C.so
RT_SRCS := $(shell find runtime -name '*.c' -not -path 'runtime/tests/*' | sort)
# The headers that generated fused kernels #include (runtime/targets/host/fuse_codegen.c),
# embedded in the library as text (tools/embed_headers.py) so fusion needs no source tree at
# run time.
FUSE_HEADERS := $(addprefix runtime/targets/host/kernels/,vecmath.h ew_exprs.h fuse_rows.h)
FUSE_HEADERS_C := $(BUILD)/gen/fuse_headers.c
# The custom kernels' ABI header (torch_tpu.kernels), embedded the same way under the
# name user sources include.
KERNEL_ABI_H := runtime/include/tpu/kernel_abi.h
KERNEL_HEADERS_C := $(BUILD)/gen/kernel_headers.c
# Any Python 3 runs the embedder (it needs no torch).
EMBED_PY ?= python3
RT_OBJS := $(RT_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/gen/fuse_headers.o $(BUILD)/gen/kernel_headers.o
TEST_SRCS := $(wildcard runtime/tests/test_*.c)
TEST_BINS := $(TEST_SRCS:runtime/tests/%.c=$(BUILD)/tests/%)
SPECS := $(wildcard runtime/targets/host/kernels/*.spec)

TORCH_DIR := $(shell TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PYTHON) -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
TORCH_ABI := $(shell TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PYTHON) -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
PY_INC    := $(shell TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
CXXFLAGS_BRIDGE := -std=c++17 -O2 -g -fPIC -Wall -Wno-unused-parameter -pthread -MMD -MP \
  -D_GLIBCXX_USE_CXX11_ABI=$(TORCH_ABI) -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
  -Iruntime/include -Iruntime -isystem $(TORCH_DIR)/include \
  -isystem $(TORCH_DIR)/include/torch/csrc/api/include -isystem $(PY_INC)
# The pjrt target compiles against the PJRT C API header of the installed xla-cpu-pjrt
# package (or PJRT_INCLUDE=DIR holding pjrt_c_api.h); without one it is built without
# the plugin client and says so when selected.
PJRT_INCLUDE ?= $(shell TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PYTHON) -c 'import os, xla_plugins.xla_cpu_pjrt as m; d = os.path.join(os.path.dirname(m.__file__), "include"); print(d if os.path.exists(os.path.join(d, "pjrt_c_api.h")) else "")' 2>/dev/null)
PJRT_CFLAGS := $(if $(PJRT_INCLUDE),-DTPU_HAVE_PJRT -isystem $(PJRT_INCLUDE))
$(BUILD)/runtime/targets/pjrt/%.o: CFLAGS_BASE += $(PJRT_CFLAGS)
$(BUILD)/tests/test_pjrt: CFLAGS_BASE += $(PJRT_CFLAGS) \
  $(if $(PJRT_INCLUDE),-DTPU_PJRT_TEST_PLUGIN='"$(abspath $(PJRT_INCLUDE)/../xla_cpu_pjrt.so)"')
# The collective transport's reduction loops: vectorized at -O3 (baseline ISA; memory-bound)
$(BUILD)/runtime/dist/%.o: CFLAGS_BASE += -O3
# torch.profiler's device activities (torch_tpu/csrc/profiler.cpp) use Kineto's headers.
$(BUILD)/torch_tpu/csrc/profiler.o: CXXFLAGS_BRIDGE += -DUSE_KINETO -isystem $(TORCH_DIR)/include/kineto
BR_SRCS := $(wildcard torch_tpu/csrc/*.cpp)
BR_OBJS := $(BR_SRCS:%.cpp=$(BUILD)/%.o)
LDFLAGS_BRIDGE := -shared -L$(TORCH_DIR)/lib -Wl,-rpath,$(TORCH_DIR)/lib '-Wl,-rpath,$$ORIGIN/../torch/lib' \
  -lc10 -ltorch -ltorch_cpu -ltorch_python -pthread -lm -ldl

.PHONY: all runtime bridge ctest defs opids clean san asan ubsan
all: bridge
runtime: $(BUILD)/libtpurt.a
bridge: $(SO)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

$(FUSE_HEADERS_C): $(FUSE_HEADERS) tools/embed_headers.py
	@mkdir -p $(dir $@)
	$(EMBED_PY) tools/embed_headers.py $@ $(FUSE_HEADERS)

$(BUILD)/gen/fuse_headers.o: $(FUSE_HEADERS_C)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

$(KERNEL_HEADERS_C): $(KERNEL_ABI_H) tools/embed_headers.py
	@mkdir -p $(dir $@)
	$(EMBED_PY) tools/embed_headers.py --table tpu_kernel_headers $@ torch_tpu_kernel.h=$(KERNEL_ABI_H)

$(BUILD)/gen/kernel_headers.o: $(KERNEL_HEADERS_C)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

$(BUILD)/libtpurt.a: $(RT_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/%: runtime/tests/%.c $(BUILD)/libtpurt.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Iruntime -o $@ $< $(BUILD)/libtpurt.a -lm -ldl -pthread

ctest: $(TEST_BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; $$t; done

$(BUILD)/torch_tpu/csrc/%.o: torch_tpu/csrc/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_BRIDGE) $(CXXFLAGS) -c $< -o $@

$(SO): $(BR_OBJS) $(BUILD)/libtpurt.a
	@mkdir -p $(dir $@)
	$(CXX) -o $@.tmp $(BR_OBJS) $(BUILD)/libtpurt.a $(LDFLAGS_BRIDGE) $(CXXFLAGS) $(LDFLAGS)
	mv -f $@.tmp $@  # atomic: a process importing the bridge meanwhile sees the old or the new one

# The runtime and its C tests under sanitizers, each build in its own directory; any
# sanitizer report fails the target (scripts/sanitize.sh adds the bridge and a Python
# workload). `san` (what scripts/run_tests.sh runs) is ASAN and UBSAN in one build at
# -O1 -g1 (line tables, so reports keep file:line): one compile of the runtime instead of
# two. `asan` and `ubsan` build each alone.
SAN_ASAN  := -fsanitize=address -fno-omit-frame-pointer
SAN_UBSAN := -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SAN_BOTH  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1
san:
	@UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(MAKE) --no-print-directory BUILD=build-sanc CFLAGS="$(SAN_BOTH)" ctest
asan:
	@$(MAKE) --no-print-directory BUILD=build-asan CFLAGS="$(SAN_ASAN)" ctest
ubsan:
	@UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(MAKE) --no-print-directory BUILD=build-ubsan CFLAGS="$(SAN_UBSAN)" ctest

# Regenerate the op inventories from their specs (needs torch in $(PYTHON)), then the op
# ids (tpu/op_ids.def) from the inventories and the lowering tables.
defs:
	@for s in $(SPECS); do $(PYTHON) tools/gen_op_defs.py $$s $${s%.spec}.def || exit 1; done
	@$(MAKE) --no-print-directory opids
# Regenerate only the op ids (no torch needed). The build also does it when a lowering
# table or an inventory changed (the file is rewritten only when its rows change, so
# nothing recompiles for an edit that names no new family).
OPIDS := runtime/include/tpu/op_ids.def
opids:
	@$(EMBED_PY) tools/gen_op_ids.py
$(OPIDS): tools/gen_op_ids.py $(wildcard runtime/lower/*.c) $(wildcard runtime/targets/host/kernels/*.def)
	@$(EMBED_PY) tools/gen_op_ids.py >/dev/null

clean:
	rm -rf $(BUILD) torch_tpu/_C.so build-sanc build-asan build-ubsan build-san

-include $(RT_OBJS:.o=.d) $(BR_OBJS:.o=.d) $(TEST_BINS:=.d)
