# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= outputs
TEST_WORKERS ?= 2
TEST_DIST ?= loadscope
TEST_ARGS ?=
STAMP := $(VENV)/.installed
LOCKS := trellis2-npu/requirements.txt sulphur2-npu/requirements.txt ursa-npu/requirements.txt ci/requirements-dev.txt \
	trellis2-npu/requirements-app.txt sulphur2-npu/requirements-app.txt ursa-npu/requirements-app.txt \
	shared/pyproject.toml trellis2-npu/pyproject.toml sulphur2-npu/pyproject.toml ursa-npu/pyproject.toml

.PHONY: demo test check-locks npu-check screenshots compat-readme publish-selftest lint format env results readme clean \
	trellis2-npu-results trellis2-npu-memory-plans trellis2-npu-bench trellis2-npu-accuracy trellis2-npu-performance \
	trellis2-npu-kernel-bench trellis2-npu-pipeline-results trellis2-npu-pipeline-full-results trellis2-npu-batch-results \
	trellis2-npu-readme trellis2-npu-pipeline-full-1024-results trellis2-npu-pipeline-full-1536-results \
	trellis2-npu-serve-results trellis2-npu-ray-results ursa-npu-ray-results sulphur2-npu-ray-results \
	ursa-npu-results ursa-npu-readme sulphur2-npu-results sulphur2-npu-readme

$(STAMP): $(LOCKS) ci/setup_venv.sh ci/system_torch.py
	PYTHON=$(PYTHON) VENV=$(VENV) ci/setup_venv.sh
	touch $@

## demo: every delivery's smoke inference on the best device (npu > cuda > cpu), outputs in outputs/; upstream
## checkouts come from TRELLIS2_SRC / URSA_SRC, else are cloned once (pinned + patched) into .upstream/
demo: $(STAMP)
	$(PY) -m deliverykit env
	$(PY) trellis2-npu/scripts/conditioning.py --smoke full --output $(OUT)/trellis2-npu
	@if src=$$(PY=$(PY) ci/demo_upstream.sh trellis2-npu "$(TRELLIS2_SRC)"); then \
		$(PY) trellis2-npu/inference.py --smoke tiny --upstream "$$src" --output $(OUT)/trellis2-npu-pipeline && \
		$(PY) trellis2-npu/inference.py --smoke tiny --mesh --upstream "$$src" --output $(OUT)/trellis2-npu-texturing; \
	else \
		echo "trellis2-npu full pipeline: skipped, no patched upstream checkout (clone failed; offline?): TRELLIS2_SRC=DIR make demo"; \
	fi
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		echo "sulphur2-npu, ursa-npu: skipped, they need Python >= 3.11 (diffusers 0.42.1): PYTHON=python3.11 make demo"; \
	else \
		$(PY) sulphur2-npu/inference.py --smoke --output $(OUT)/sulphur2-npu/smoke.mp4 && \
		$(PY) sulphur2-npu/inference.py --smoke --pipeline keyframes --keyframe $(OUT)/sulphur2-npu/smoke_first.png:0 \
			--keyframe $(OUT)/sulphur2-npu/smoke_last.png:8 --output $(OUT)/sulphur2-npu-keyframes/keyframes.mp4 && \
		$(PY) sulphur2-npu/inference.py --smoke --pipeline two-stage-hq --output $(OUT)/sulphur2-npu-hq/two-stage-hq.mp4 && \
		$(PY) sulphur2-npu/inference.py --smoke --pipeline a2v --output $(OUT)/sulphur2-npu-a2v/a2v.mp4 && \
		$(PY) sulphur2-npu/inference.py --smoke --pipeline retake --video $(OUT)/sulphur2-npu-a2v/a2v.mp4 \
			--retake-start 0.1 --retake-end 0.25 --output $(OUT)/sulphur2-npu-retake/retake.mp4 && \
		if src=$$(PY=$(PY) ci/demo_upstream.sh ursa-npu "$(URSA_SRC)"); then \
			$(PY) ursa-npu/inference.py --smoke --upstream "$$src" --output $(OUT)/ursa-npu/smoke.jpg; \
		else \
			echo "ursa-npu: skipped, no patched upstream checkout (clone failed; offline?): URSA_SRC=DIR make demo"; \
		fi; \
	fi

## test: lint + every lock resolving on x86_64 and aarch64 + the whole test suite (tests that need an upstream checkout
## skip with a reason), on TEST_WORKERS processes (pytest-xdist; TEST_DIST=loadscope keeps each test module on one, so
## module fixtures are built once; TEST_WORKERS=0: one process); ends with the 10 slowest tests and the total time.
## check-locks (mostly waiting on the index) runs beside pytest; its lines are printed after pytest's.
## TEST_ARGS passes more pytest options, e.g. TEST_ARGS="--order shuffle --order-seed 7" (conftest.py)
test: $(STAMP)
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint || exit $$?; \
	locks_log=$$(mktemp); $(PY) ci/check_locks.py > $$locks_log 2>&1 & locks=$$!; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist $(TEST_DIST) --durations=10 $(TEST_ARGS); status=$$?; \
	wait $$locks; locks_status=$$?; echo "$(PY) ci/check_locks.py (beside pytest):"; cat $$locks_log; rm -f $$locks_log; \
	if [ $$status -eq 0 ]; then status=$$locks_status; fi; \
	echo "make test: $$(( $$(date +%s) - start )) s in total (lint, check-locks, pytest), exit $$status"; \
	exit $$status

## check-locks: every lock resolves to manylinux x86_64 / aarch64 wheels for CPython 3.11 (~1 min, needs the index)
check-locks: $(STAMP)
	$(PY) ci/check_locks.py

## screenshots: the READMEs' web demo pictures, taken by the browser tests (needs chromium + chromedriver and the
## upstream checkouts: TRELLIS2_SRC / URSA_SRC)
screenshots: $(STAMP)
	mkdir -p outputs/screenshots
	DELIVERYKIT_SCREENSHOTS=$(CURDIR)/outputs/screenshots $(PY) -m pytest -q -p no:cacheprovider \
		$(wildcard */tests/test_app.py)
	for delivery in trellis2-npu sulphur2-npu ursa-npu; do \
		for shot in outputs/screenshots/$$delivery-app*.png; do \
			if [ -f $$shot ]; then mkdir -p $$delivery/docs && cp $$shot $$delivery/docs/$${shot#outputs/screenshots/$$delivery-}; fi; \
		done; \
	done

## compat-readme: the root README's version table from results/compat.json (written by ci/compat_check.py)
compat-readme: $(STAMP)
	$(PY) -m deliverykit readme backfill --readme README.md --results results/compat.json

## publish-selftest: only the out-of-tree check of `deliverykit publish` (part of `test`; minutes, needs the package index;
## SELFTEST_ALL_TESTS=1 also runs the staged test suites, not only collects them)
publish-selftest: $(STAMP)
	$(PY) -m pytest shared/tests/test_publish_selftest.py

## npu-check: on an Ascend host, the environment, the device-gated tests and every delivery's NPU benchmarks, one
## results file per delivery in outputs/npu-check/ (TRELLIS2_SRC / URSA_SRC for the upstream-based benchmarks)
npu-check: $(STAMP)
	$(PY) -m deliverykit npu-check --output $(OUT)/npu-check

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

env: $(STAMP)
	$(PY) -m deliverykit env

## results DELIVERY=<name>: every results file of one delivery (CPU, random weights) and its README tables; readme
## DELIVERY=<name>: the tables only. trellis2-npu and ursa-npu need their checkout (TRELLIS2_SRC, URSA_SRC).
DELIVERIES := trellis2-npu sulphur2-npu ursa-npu
results readme: $(STAMP)
	@case " $(DELIVERIES) " in *" $(DELIVERY) "*) ;; \
		*) echo "error: pass DELIVERY=<name>, one of $(DELIVERIES) (got '$(DELIVERY)')"; exit 2;; esac
	$(MAKE) --no-print-directory $(DELIVERY)-$@

## trellis2-npu-results: the trellis2-npu groups below but the full-size pipeline (tens of minutes)
trellis2-npu-results: trellis2-npu-memory-plans trellis2-npu-bench trellis2-npu-accuracy trellis2-npu-performance \
	trellis2-npu-kernel-bench trellis2-npu-pipeline-results trellis2-npu-batch-results

## trellis2-npu-memory-plans: what --memory auto picks per card and pipeline type (computed, seconds)
trellis2-npu-memory-plans: $(STAMP)
	$(PY) trellis2-npu/scripts/memory_plans.py --output trellis2-npu/results/memory_plans.json

## trellis2-npu-bench / -accuracy / -performance / -kernel-bench / -readme: trellis2-npu/results/*.json and its
## README tables, one group at a time
trellis2-npu-bench: $(STAMP)
	$(PY) trellis2-npu/benchmarks/dinov3_overhead.py --output trellis2-npu/results/overhead.json

trellis2-npu-accuracy: $(STAMP)
	$(PY) trellis2-npu/scripts/accuracy.py --smoke full --target auto --output trellis2-npu/results/accuracy.json

trellis2-npu-performance: $(STAMP)
	$(PY) trellis2-npu/scripts/conditioning.py --smoke full --device cpu --bench --output $(OUT)/bench \
		--report trellis2-npu/results/performance.json

trellis2-npu-kernel-bench: $(STAMP)
	$(PY) trellis2-npu/benchmarks/varlen_attention.py --output trellis2-npu/results/varlen_attention.json
	$(PY) trellis2-npu/benchmarks/sparse_conv.py --output trellis2-npu/results/sparse_conv.json
	$(PY) trellis2-npu/benchmarks/glb_bake.py --output trellis2-npu/results/glb_bake.json
	$(PY) trellis2-npu/benchmarks/glb_export.py --output trellis2-npu/results/glb_export.json
	$(PY) trellis2-npu/benchmarks/glb_export.py --no-remesh --output trellis2-npu/results/glb_export_no_remesh.json
	OMP_NUM_THREADS=1 $(PY) trellis2-npu/benchmarks/turntable.py --output trellis2-npu/results/turntable.json

## trellis2-npu-pipeline-results: the tiny full pipeline's per-stage report (needs TRELLIS2_SRC = a patched checkout)
trellis2-npu-pipeline-results: $(STAMP)
	$(PY) trellis2-npu/inference.py --smoke tiny --upstream "$(TRELLIS2_SRC)" --device cpu \
		--output $(OUT)/pipeline-tiny --report trellis2-npu/results/pipeline_tiny.json

## trellis2-npu-pipeline-full-results: the pipeline at the released sizes on the CPU, per stage (TRELLIS2_SRC; tens of minutes,
## ~12 GB peak RSS, ~11 GB of temporary weights)
trellis2-npu-pipeline-full-results: $(STAMP)
	$(PY) trellis2-npu/benchmarks/pipeline_full.py --smoke full --pipeline 512 --steps 1 --upstream "$(TRELLIS2_SRC)" \
		--output trellis2-npu/results/pipeline_full.json

## trellis2-npu-pipeline-full-1024-results: the same for upstream's default 1024_cascade (TRELLIS2_SRC; about an hour on
## 2 cores, ~12 GB of temporary weights)
trellis2-npu-pipeline-full-1024-results: $(STAMP)
	$(PY) trellis2-npu/benchmarks/pipeline_full.py --smoke full --pipeline 1024_cascade --steps 1 \
		--upstream "$(TRELLIS2_SRC)" --output trellis2-npu/results/pipeline_full_1024_cascade.json

## trellis2-npu-pipeline-full-1536-results: the same for 1536_cascade, its grid lowered to what the free memory holds
## (TRELLIS2_SRC; about half an hour on 2 cores, ~12 GB of temporary weights)
trellis2-npu-pipeline-full-1536-results: $(STAMP)
	$(PY) trellis2-npu/benchmarks/pipeline_full.py --smoke full --pipeline 1536_cascade --steps 1 \
		--upstream "$(TRELLIS2_SRC)" --output trellis2-npu/results/pipeline_full_1536_cascade.json

## trellis2-npu-batch-results: items per hour, one --batch process vs one process per item (tiny pipeline; TRELLIS2_SRC)
trellis2-npu-batch-results: $(STAMP)
	$(PY) shared/benchmarks/batch_throughput.py --items 3 --input seed \
		--output trellis2-npu/results/batch_throughput.json -- \
		$(PY) trellis2-npu/inference.py --smoke tiny --upstream "$(TRELLIS2_SRC)" --device cpu
	$(MAKE) trellis2-npu-readme

## <delivery>-ray-results: items per hour of --batch --ray on a local cluster of 1 and 2 nodes vs one --batch process
trellis2-npu-ray-results: $(STAMP)
	$(PY) shared/benchmarks/ray_scaling.py --items 4 --input seed --output trellis2-npu/results/ray_scaling.json -- \
		$(PY) trellis2-npu/inference.py --smoke tiny --upstream "$(TRELLIS2_SRC)" --device cpu --no-remesh \
		--texture-size 512 --preview-frames 0
	$(MAKE) trellis2-npu-readme

ursa-npu-ray-results: $(STAMP)
	$(PY) shared/benchmarks/ray_scaling.py --items 12 --output ursa-npu/results/ray_scaling.json -- \
		$(PY) ursa-npu/inference.py --upstream "$(URSA_SRC)" --smoke tiny512 --device cpu
	$(MAKE) ursa-npu-readme

sulphur2-npu-ray-results: $(STAMP)
	$(PY) shared/benchmarks/ray_scaling.py --items 12 --output sulphur2-npu/results/ray_scaling.json -- \
		$(PY) sulphur2-npu/inference.py --smoke --device cpu
	$(MAKE) sulphur2-npu-readme

## trellis2-npu-serve-results: requests per hour through serve.py vs one --batch process (tiny pipeline; TRELLIS2_SRC)
trellis2-npu-serve-results: $(STAMP)
	$(PY) shared/benchmarks/serve_overhead.py --api assets --items 4 --rounds 2 \
		--output trellis2-npu/results/serve_overhead.json -- \
		$(PY) trellis2-npu/serve.py --smoke tiny --upstream "$(TRELLIS2_SRC)" --device cpu --no-remesh \
		--texture-size 512 --preview-frames 0
	$(MAKE) trellis2-npu-readme

trellis2-npu-readme: $(STAMP)
	$(PY) -m deliverykit readme backfill --readme trellis2-npu/README.md \
		--results trellis2-npu/results/accuracy.json --results trellis2-npu/results/overhead.json \
		--results trellis2-npu/results/performance.json --results trellis2-npu/results/pipeline_tiny.json \
		--results trellis2-npu/results/varlen_attention.json --results trellis2-npu/results/sparse_conv.json \
		--results trellis2-npu/results/glb_bake.json --results trellis2-npu/results/glb_export.json \
		--results trellis2-npu/results/glb_export_no_remesh.json \
		--results trellis2-npu/results/pipeline_full.json \
		--results trellis2-npu/results/pipeline_full_1024_cascade.json \
		--results trellis2-npu/results/pipeline_full_1536_cascade.json \
		--results trellis2-npu/results/turntable.json --results trellis2-npu/results/memory_plans.json \
		$(if $(wildcard trellis2-npu/results/batch_throughput.json),--results trellis2-npu/results/batch_throughput.json) \
		$(if $(wildcard trellis2-npu/results/serve_overhead.json),--results trellis2-npu/results/serve_overhead.json) \
		$(if $(wildcard trellis2-npu/results/ray_scaling.json),--results trellis2-npu/results/ray_scaling.json)

## ursa-npu-results: ursa-npu/results/*.json and its README tables (needs URSA_SRC = a patched checkout)
ursa-npu-results: $(STAMP)
	$(PY) ursa-npu/inference.py --upstream "$(URSA_SRC)" --smoke --device cpu --bench --warmup 1 --runs 5 \
		--output $(OUT)/ursa-bench/out.jpg --report ursa-npu/results/inference_tiny.json
	$(PY) ursa-npu/benchmarks/text_to_image_512.py --smoke --upstream "$(URSA_SRC)" --device cpu --steps 25 \
		--warmup 1 --runs 3 --report ursa-npu/results/benchmark_512.json
	$(PY) ursa-npu/scripts/accuracy.py --upstream "$(URSA_SRC)" --smoke --target cpu --dtype fp16 \
		--output ursa-npu/results/accuracy.json
	$(PY) ursa-npu/scripts/accuracy.py --upstream "$(URSA_SRC)" --smoke --target cpu --dtype bf16 \
		--output ursa-npu/results/accuracy_bf16.json
	$(PY) shared/benchmarks/batch_throughput.py --items 6 --single-suffix .jpg \
		--output ursa-npu/results/batch_throughput.json -- \
		$(PY) ursa-npu/inference.py --upstream "$(URSA_SRC)" --smoke --device cpu
	$(PY) shared/benchmarks/serve_overhead.py --api images --items 12 --rounds 3 \
		--output ursa-npu/results/serve_overhead.json -- \
		$(PY) ursa-npu/serve.py --upstream "$(URSA_SRC)" --smoke tiny512 --device cpu
	$(MAKE) ursa-npu-readme

ursa-npu-readme: $(STAMP)
	$(PY) -m deliverykit readme backfill --readme ursa-npu/README.md --results ursa-npu/results/inference_tiny.json \
		--results ursa-npu/results/benchmark_512.json --results ursa-npu/results/accuracy.json \
		--results ursa-npu/results/accuracy_bf16.json --results ursa-npu/results/batch_throughput.json \
		--results ursa-npu/results/serve_overhead.json --results ursa-npu/results/ray_scaling.json

## sulphur2-npu-results: sulphur2-npu/results/*.json (CPU, tiny random model; ~10 min + ~1.5 GB temp, 4 GB RAM) and README tables
SULPHUR_RESULTS := memory_plans attention rope_precision inference_tiny overhead loader accuracy accuracy_bf16 \
	parallel_parity parallel_cpu vae_decode reference_ltx batch_throughput serve_overhead ray_scaling pipelines
sulphur2-npu-results: $(STAMP)
	$(PY) sulphur2-npu/scripts/memory_plans.py --output sulphur2-npu/results/memory_plans.json
	$(PY) sulphur2-npu/benchmarks/attention_parity.py --output sulphur2-npu/results/attention.json
	$(PY) sulphur2-npu/benchmarks/rope_precision.py --output sulphur2-npu/results/rope_precision.json
	OMP_NUM_THREADS=1 $(PY) sulphur2-npu/inference.py --smoke --device cpu --pipeline one-stage --bench --warmup 1 --runs 5 \
		--output $(OUT)/sulphur2-bench/out.mp4 --report sulphur2-npu/results/inference_tiny.json
	# one thread and 60 rounds: on 2 shared cores the ratio otherwise moves by ±3 % from run to run
	OMP_NUM_THREADS=1 $(PY) sulphur2-npu/benchmarks/sulphur_overhead.py --rounds 60 --output sulphur2-npu/results/overhead.json
	$(PY) sulphur2-npu/benchmarks/loader_throughput.py --output sulphur2-npu/results/loader.json
	# against ltx-core / ltx-pipelines: needs LTX2_SRC (a Lightricks/LTX-2 checkout at 400fd310), else kept as is
	@if [ -n "$(LTX2_SRC)" ]; then LTX2_SRC=$(LTX2_SRC) $(PY) sulphur2-npu/scripts/reference_ltx.py \
		--output sulphur2-npu/results/reference_ltx.json; else echo "reference_ltx: LTX2_SRC unset, kept"; fi
	@if [ -n "$(LTX2_SRC)" ]; then LTX2_SRC=$(LTX2_SRC) $(PY) sulphur2-npu/benchmarks/pipelines.py --rounds 5 \
		--output sulphur2-npu/results/pipelines.json; else echo "pipelines: LTX2_SRC unset, kept"; fi
	$(PY) sulphur2-npu/scripts/accuracy.py --output sulphur2-npu/results/accuracy.json
	$(PY) sulphur2-npu/scripts/parallel_parity.py --output sulphur2-npu/results/parallel_parity.json
	$(PY) sulphur2-npu/benchmarks/parallel_scaling.py --output sulphur2-npu/results/parallel_cpu.json
	$(PY) sulphur2-npu/benchmarks/vae_decode_share.py --output sulphur2-npu/results/vae_decode.json
	# bf16 vs fp32 fails the hidden-state thresholds by design (exit 8): it shows what the tool reports
	$(PY) sulphur2-npu/scripts/accuracy.py --target-dtype bf16 --output sulphur2-npu/results/accuracy_bf16.json \
		|| [ $$? -eq 8 ]
	$(PY) shared/benchmarks/batch_throughput.py --items 6 --single-suffix .mp4 \
		--output sulphur2-npu/results/batch_throughput.json -- $(PY) sulphur2-npu/inference.py --smoke --device cpu
	$(PY) shared/benchmarks/serve_overhead.py --api videos --items 12 --rounds 3 \
		--output sulphur2-npu/results/serve_overhead.json -- $(PY) sulphur2-npu/serve.py --smoke --device cpu
	$(MAKE) sulphur2-npu-readme

sulphur2-npu-readme: $(STAMP)
	$(PY) -m deliverykit readme backfill --readme sulphur2-npu/README.md \
		$(foreach name,$(SULPHUR_RESULTS),--results sulphur2-npu/results/$(name).json)

clean:
	rm -rf $(VENV)
