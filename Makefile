# Every target creates .venv on first use; see README.
PY      := .venv/bin/python
STAMP   := .venv/.installed

.PHONY: venv demo test bench clean

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

# One PATH for the whole run: DeepSpeed's JIT ops are rebuilt (~1 min) whenever the `ninja`
# found first changes, and the venv's ninja differs from the system's.
test: export PATH := $(CURDIR)/.venv/bin:$(PATH)
test: $(STAMP)
	$(PY) tests/warm_ops.py
	$(PY) -m pytest -q -p no:cacheprovider --durations=15

bench: $(STAMP)
	$(PY) benchmarks/cli_startup.py

clean:
	rm -rf .venv build *.egg-info
