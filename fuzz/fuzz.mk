# Fuzzing (issue 4). Included from the top-level Makefile:
#   include fuzz/fuzz.mk
#
#   make fuzz      every target for FUZZ_SECS seconds (default 300)
#   make fuzz-ci   CI: the policy and seccomp targets for FUZZ_CI_SECS
#                  seconds each (default 60), the five artifact parser
#                  targets, the CPU throttle's /proc/<pid>/stat parser,
#                  `jail serve`'s input_tar planner, the pool's
#                  request-line parser, a session's reply as its client
#                  reads it, the path acceptor every door
#                  uses (accept_paths: link tricks over a scratch tree,
#                  against an lstat oracle) and a step's rich results as
#                  the supervisor reads them off the control channel
#                  (display_channel) and a session's files API over a
#                  tree of link tricks (session_files) for
#                  FUZZ_PARSER_CI_SECS each (default 30):
#                  2 x 60 + 12 x 30 = 480 s of fuzzing,
#                  plus the build
#
# The parser targets (issue 15) run the artifact summarisers over
# attacker-made files and fail an input whose parse passes its memory
# budget (a counting allocator, fuzz/src/lib.rs) or its time budget, not
# only one that crashes.
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

FUZZ_DIR            ?= fuzz
FUZZ_CORE_TARGETS   ?= policy_loader seccomp_differential
FUZZ_PARSER_TARGETS ?= office_zip csv image_headers markup json proc_stat serve_tar pool_line session_answer accept_paths display_channel session_files
FUZZ_TARGETS        ?= $(FUZZ_CORE_TARGETS) $(FUZZ_PARSER_TARGETS)
FUZZ_SECS           ?= 300
FUZZ_CI_SECS        ?= 60
FUZZ_PARSER_CI_SECS ?= 30
FUZZ_CARGO          ?= RUSTC_BOOTSTRAP=1 cargo fuzz
FUZZ_FLAGS          ?= -s none
FUZZ_LIBFUZZER      ?= -timeout=20 -rss_limit_mb=2048


# $(call fuzz_run,SECONDS,TARGETS)
define fuzz_run
	cd $(FUZZ_DIR) && for t in $(2); do \
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
	$(call fuzz_run,$(FUZZ_SECS),$(FUZZ_TARGETS))

fuzz-ci: fuzz-build
	$(call fuzz_run,$(FUZZ_CI_SECS),$(FUZZ_CORE_TARGETS))
	$(call fuzz_run,$(FUZZ_PARSER_CI_SECS),$(FUZZ_PARSER_TARGETS))

fuzz-merge: fuzz-build
	cd $(FUZZ_DIR) && for t in $(FUZZ_TARGETS); do \
		mkdir -p corpus-scratch/$$t && \
		$(FUZZ_CARGO) run $(FUZZ_FLAGS) $$t corpus/$$t corpus-scratch/$$t -- -merge=1 -use_counters=0 || exit 1; \
	done
