# Fuzzing (issue 4). Included from the top-level Makefile:
#   include fuzz/fuzz.mk
#
#   make fuzz      every target for FUZZ_SECS seconds (default 300)
#   make fuzz-ci   every target for FUZZ_CI_SECS seconds (default 60); CI
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). cargo-fuzz asks
# rustc for unstable flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain
# take them. Sanitizers are off (-s none): the targets are safe Rust over
# libseccomp, and without ASan they run ~3x more inputs a minute.
#
# New inputs go to a scratch corpus (fuzz/corpus-scratch, ignored by git),
# reading the committed seeds in fuzz/corpus; a crash or a mismatch stops
# the run with a non-zero status and leaves the input in fuzz/artifacts/.
# `make fuzz-merge` folds the scratch finds into the committed corpus.

FUZZ_DIR       ?= fuzz
FUZZ_TARGETS   ?= policy_loader seccomp_differential
FUZZ_SECS      ?= 300
FUZZ_CI_SECS   ?= 60
FUZZ_CARGO     ?= RUSTC_BOOTSTRAP=1 cargo fuzz
FUZZ_FLAGS     ?= -s none
FUZZ_LIBFUZZER ?= -timeout=20 -rss_limit_mb=2048


define fuzz_run
	cd $(FUZZ_DIR) && for t in $(FUZZ_TARGETS); do \
		mkdir -p corpus-scratch/$$t corpus/$$t && \
		echo "fuzz: $$t for $(1)s" && \
		$(FUZZ_CARGO) run $(FUZZ_FLAGS) $$t corpus-scratch/$$t corpus/$$t -- \
			-max_total_time=$(1) $(FUZZ_LIBFUZZER) $$( [ $$t = policy_loader ] && echo -dict=policy.dict ) \
			|| exit 1; \
	done
endef

.PHONY: fuzz fuzz-ci fuzz-build fuzz-merge

fuzz-build:
	cd $(FUZZ_DIR) && $(FUZZ_CARGO) build $(FUZZ_FLAGS)

fuzz: fuzz-build
	$(call fuzz_run,$(FUZZ_SECS))

fuzz-ci: fuzz-build
	$(call fuzz_run,$(FUZZ_CI_SECS))

fuzz-merge: fuzz-build
	cd $(FUZZ_DIR) && for t in $(FUZZ_TARGETS); do \
		mkdir -p corpus-scratch/$$t && \
		$(FUZZ_CARGO) run $(FUZZ_FLAGS) $$t corpus/$$t corpus-scratch/$$t -- -merge=1 -use_counters=0 || exit 1; \
	done
