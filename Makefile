# The two commands of the README's quick start, and the benchmarks.
.PHONY: run test bench setup demo

setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/journalq serve --data ./data

test: setup
	.venv/bin/ruff check src tests bench
	.venv/bin/python -m pytest

bench: setup
	.venv/bin/python bench/run.py

demo: setup
	.venv/bin/journalq demo --data ./data/demo
