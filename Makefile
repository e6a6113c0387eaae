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

demo: $(STAMP)
	$(PY) -m zerofit.demo

test: $(STAMP)
	$(PY) tests/warm_ops.py
	$(PY) -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(PY) benchmarks/cli_startup.py

clean:
	rm -rf .venv build *.egg-info
