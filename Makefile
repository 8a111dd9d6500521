# Fleetwatch developer targets. Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The PostgreSQL + Redis pass of `make test` (services on this machine; see DEVELOPERS.md).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_REDIS_URL    ?= redis://127.0.0.1:6379/15
PYTEST_ARGS       ?=

.PHONY: setup run test test-busy test-embedded test-services services worker beat lint format bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,agent,dev,bench,kubernetes]'
	touch $(STAMP)

setup: $(STAMP)

## run: migrate, load the demo fleet through the upload API, serve on 127.0.0.1:8000
run: setup
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py demo_fleet
	$(BIN)/python manage.py runserver 127.0.0.1:8000

## test: the whole suite on the embedded default, then on PostgreSQL + Redis
test: test-embedded test-services

## test-busy: `make test` with two CPU burners beside it (run it before you push)
test-busy: setup
	bash scripts/test-busy.sh

test-embedded: setup
	env -u DATABASE_URL -u CELERY_BROKER_URL -u REDIS_URL $(BIN)/pytest $(PYTEST_ARGS)

## test-services: the tests a database or broker can change, on PostgreSQL + Redis
## (FLEETWATCH_TEST_PASS=services; the backend-independent rest runs once, in test-embedded)
test-services: setup services
	FLEETWATCH_TEST_PASS=services FLEETWATCH_DATA_DIR=$(CURDIR)/var/test-services \
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_REDIS_URL) REDIS_URL=$(TEST_REDIS_URL) \
		$(BIN)/pytest $(PYTEST_ARGS)

services:
	bash scripts/services.sh

## worker: a Celery worker (needs CELERY_BROKER_URL and DATABASE_URL). Both queues by default;
## `make worker QUEUES=ingest` or `QUEUES=analysis` for one, to scale parsing and analysis apart.
QUEUES ?= ingest,analysis
worker: setup
	$(BIN)/celery -A fleet worker -Q $(QUEUES) --loglevel=INFO

## beat: the periodic tasks (fleet memory, weekly report, the sweep that re-enqueues lost work)
beat: setup
	$(BIN)/celery -A fleet beat --loglevel=INFO --schedule var/celerybeat-schedule

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup services
	$(BIN)/python -m bench

## bench-quick: the CI-sized bench (smaller inputs, a 128-host load burst); exits 1 on a failed gate
bench-quick: setup services
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
