# The two commands of the README: `make demo` and `make test`.
# Each creates .venv and installs the project on a fresh machine; nothing by hand first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test model bench clean

# every extra (worker, api, jobs) and the test tools, at the exact versions of constraints.txt
$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -c constraints.txt -e '.[all,dev]'
	# instructor pins jiter<0.15, which only openai 3.3 accepts: installed without its
	# dependencies (the dev extra has the ones it imports) so the tests keep today's openai
	$(PY) -m pip install --disable-pip-version-check -q --no-deps instructor==1.17.0
	touch $(STAMP)

venv: $(STAMP)

model: $(STAMP)
	$(VENV)/bin/inflight model fetch

demo: $(STAMP)
	$(VENV)/bin/inflight demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
