# pyobmem: `make` builds the shim, `make test` sets up and runs the tests, `make demo` traces an
# example workload. CUDA headers come from $(CUDA_HOME) (default /usr/local/cuda); nothing from
# CUDA is linked: the shim dlopens libcuda and libcupti at run time.
CUDA_HOME ?= /usr/local/cuda
PYTHON ?= python3
VENV ?= .venv
ifeq ($(origin CC),default)
CC := gcc
endif
WERROR ?= -Werror
CFLAGS ?= -O2 -g -Wall -Wextra $(WERROR) -fvisibility=hidden
# SELFTIME=1: a shim that times its own parts and prints them at exit (native/selftime.c); rebuild
# with `make -B native SELFTIME=1`, and without it to go back.
ifeq ($(SELFTIME),1)
CFLAGS += -DPYOBMEM_SELF_TIME
endif
SHIM := pyobmem/libpyobmem.so
SHIM_SRC := $(wildcard native/*.c)
SHIM_HDR := $(wildcard native/*.h native/*.def pyobmem/include/pyobmem/*.h)

.PHONY: all native venv test demo clean

all: native

native: $(SHIM)

$(SHIM): $(SHIM_SRC) $(SHIM_HDR)
	@test -f $(CUDA_HOME)/include/cuda.h || { echo "error: CUDA headers not found in $(CUDA_HOME)/include (set CUDA_HOME)"; exit 1; }
	$(CC) $(CFLAGS) -std=gnu11 -fPIC -shared -Ipyobmem/include -Inative -I$(CUDA_HOME)/include \
		-o $@ $(SHIM_SRC) -ldl -lpthread

# The venv sees system site-packages so that a GPU machine's torch, jax and cupy are usable.
$(VENV)/.done: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q -e '.[test]' || \
		$(VENV)/bin/python -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

venv: $(VENV)/.done

test: venv native
	$(VENV)/bin/python -m pytest -q

demo: venv native
	PATH=$(abspath $(VENV))/bin:$$PATH sh scripts/demo.sh

clean:
	rm -rf $(SHIM) $(VENV) build dist *.egg-info
