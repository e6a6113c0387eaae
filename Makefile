# Every target creates .venv on first use; see README.
PY      := .venv/bin/python
STAMP   := .venv/.installed

.PHONY: venv demo test bench clean cluster-deps

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: export PATH := $(CURDIR)/.venv/bin:$(PATH)
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
test: $(STAMP) cluster-deps
	$(PY) tests/warm_ops.py
	$(PY) -m pytest -q -p no:cacheprovider --durations=15

bench: $(STAMP)
	$(PY) benchmarks/cli_startup.py

clean:
	rm -rf .venv build *.egg-info
