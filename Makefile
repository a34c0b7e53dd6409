# The two commands a new user needs: `make demo` (the live TUI on a failing run) and `make test`.
.PHONY: setup demo test lint bench screenshots docs

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/nnwatch demo exploding

test: setup
	@bash scripts/system-deps.sh
	bash scripts/test.sh

# what CI runs after the tests: ruff, the import contracts (type-only imports included) and mypy
lint: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/mypy

bench: setup
	.venv/bin/python bench/overhead.py
	.venv/bin/python bench/load_run.py
	.venv/bin/python bench/channel.py
	.venv/bin/python bench/tui.py
	.venv/bin/python bench/detection.py
	@# the three columns of the detection table: own corpus (above), the external suite (run in
	@# place, never copied in) and the cases written apart from the detectors
	@if [ -f ../shared/benchmarks/pathologies/run_nnwatch.py ]; then \
		.venv/bin/python ../shared/benchmarks/pathologies/run_nnwatch.py --seeds 0,1,2 --controls; \
	else echo "bench: no external suite at ../shared/benchmarks/pathologies (skipped)"; fi
	.venv/bin/python bench/written_apart/run_nnwatch.py --seeds 0,1,2 --controls
	.venv/bin/python bench/written_apart_2/run_nnwatch.py --seeds 0,1,2 --controls
	.venv/bin/python bench/remote.py
	.venv/bin/python bench/stacks.py
	.venv/bin/python bench/corpus.py
	.venv/bin/python bench/writer_stalls.py
	.venv/bin/python bench/sharded.py

screenshots: setup
	.venv/bin/python scripts/screenshots.py

# The manual in docs/ (mkdocs-material, the API page from docstrings), built into site/; strict:
# a broken link or a docstring that does not render fails it. The `docs` extra brings mkdocs.
docs: setup
	@.venv/bin/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null \
		|| .venv/bin/python -m pip install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
