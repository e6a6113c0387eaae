# Every target creates .venv on first use; see README.
PY      := .venv/bin/python
STAMP   := .venv/.installed

# Where torch comes from. PyPI's `torch==2.13.0` is the CUDA build plus ~15 nvidia wheels (several
# GB), whatever the machine; a version pin does not pick the CPU build. So on a machine without an
# NVIDIA driver, PyTorch's CPU wheel index is added (its `2.13.0+cpu` sorts above PyPI's `2.13.0`).
# Where that index cannot even be resolved (an offline mirror such as this project's CI machine),
# pip's own configuration must supply the wheel, and asking the index would only cost retries.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
HAS_NVIDIA      := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
CPU_INDEX_UP    := $(shell python3 -c 'import socket; socket.getaddrinfo("download.pytorch.org", 443)' >/dev/null 2>&1 && echo yes)
TORCH_SOURCE    := $(if $(HAS_NVIDIA),,$(if $(CPU_INDEX_UP),--extra-index-url $(TORCH_CPU_INDEX)))

.PHONY: venv demo test bench clean cluster-deps

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt $(TORCH_SOURCE) torch
	@$(PY) -c 'import torch, sys; gpu = "$(HAS_NVIDIA)"; cuda = torch.version.cuda; \
	  sys.exit(0) if gpu or cuda is None else \
	  print(f"warning: torch {torch.__version__} is a CUDA build on a machine without an NVIDIA driver")'
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

# DeepSpeed's JIT ops are built once per venv, in the venv (not in ~/.cache/torch_extensions, which
# every clone and venv of the machine shares and rebuilds for the others); a directory already set
# in the environment wins.
EXTENSIONS_DIR := $(CURDIR)/.venv/torch_extensions

demo: export PATH := $(CURDIR)/.venv/bin:$(PATH)
demo: export TORCH_EXTENSIONS_DIR ?= $(EXTENSIONS_DIR)
demo: $(STAMP)
	$(PY) -m zerofit.demo

# The real Slurm cluster and DeepSpeed pdsh tests (tests/launch/test_slurm_cluster.py,
# test_deepspeed_pdsh.py) need these Debian packages; installed when missing (root + apt only;
# elsewhere those tests skip and say why).
CLUSTER_PKGS := slurmctld slurmd slurm-client munge openssh-server openssh-client pdsh
cluster-deps:
	@missing=$$(for p in $(CLUSTER_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $$missing >/dev/null \
	  || echo "cluster-deps: installing failed: the cluster tests will skip"; \
	else echo "cluster-deps: $$missing missing and not root with apt-get: the cluster tests will skip"; fi

# One PATH for the whole run: DeepSpeed's JIT ops are rebuilt (~1 min) whenever the `ninja`
# found first changes, and the venv's ninja differs from the system's.
test: export PATH := $(CURDIR)/.venv/bin:$(PATH)
test: export TORCH_EXTENSIONS_DIR ?= $(EXTENSIONS_DIR)
test: $(STAMP) cluster-deps
	.venv/bin/ruff check .
	$(PY) tests/warm_ops.py
	$(PY) tests/run_suite.py

bench: $(STAMP)
	$(PY) benchmarks/cli_startup.py

clean:
	rm -rf .venv build *.egg-info
