# jail-agent's demo, included by the top Makefile (`include agent/agent.mk`).
# It runs the EDA-and-presentation task on examples/titanic.csv against the
# model endpoint in LLM_BASE_URL / LLM_MODEL (/ LLM_API_KEY); see agent/README.md.
CARGO ?= cargo
SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)
AGENT_DEMO_DIR ?= target/demo-agent
AGENT_TASK ?= Do an exploratory data analysis of the Titanic passenger list in titanic.csv and prepare a presentation of the main findings. Deliver a summary table as summary.csv, charts as PNG files, and a slide deck as presentation.pptx.
# The data rootfs (pandas, matplotlib, python-pptx), built on first use.
# AGENT_ROOTFS=python-rootfs/out/minimal runs on the standard library alone
# (no charts, no deck: the agent delivers tables and text instead).
AGENT_ROOTFS ?= python-rootfs/out/data
# Seconds one step may take: the data stack imports in a few seconds.
AGENT_STEP_TIMEOUT ?= 60
# The steps' policy: on the data rootfs policies/data.json, the default plus
# numpy, pandas and matplotlib.pyplot preloaded in the warm pool's jails
# (imported before any step, so a sub-task's first step does not wait for
# them); on any other rootfs the built-in default, which preloads nothing
# (the minimal rootfs has none of those modules).
AGENT_POLICY ?= $(if $(filter python-rootfs/out/data,$(AGENT_ROOTFS)),policies/data.json,)
# Jails the run's warm pool keeps made ahead (0: no pool).
AGENT_POOL_SIZE ?= 1

.PHONY: demo-agent
demo-agent: ## run jail-agent on examples/titanic.csv: summary CSV, charts, .pptx (needs LLM_BASE_URL, LLM_MODEL)
	@if [ -z "$$LLM_BASE_URL" ] || [ -z "$$LLM_MODEL" ]; then \
	    echo "demo-agent: set LLM_BASE_URL and LLM_MODEL to an OpenAI-compatible endpoint with tool calling,"; \
	    echo "            e.g. LLM_BASE_URL=http://localhost:11434/v1 LLM_MODEL=qwen2.5:14b make demo-agent (see agent/README.md)"; \
	    exit 2; \
	fi
	@if [ ! -x "$(AGENT_ROOTFS)/usr/bin/python3" ]; then \
	    if [ "$(AGENT_ROOTFS)" = python-rootfs/out/data ]; then $(SUDO) python-rootfs/build.sh data; \
	    else echo "demo-agent: no rootfs at $(AGENT_ROOTFS) (make rootfs, or make rootfs-data)"; exit 2; fi; \
	fi
	$(CARGO) build --release -p jail -p agent
	rm -rf $(AGENT_DEMO_DIR)
	mkdir -p $(AGENT_DEMO_DIR)/input $(AGENT_DEMO_DIR)/sessions
	cp examples/titanic.csv $(AGENT_DEMO_DIR)/input/
	target/release/jail-agent run --task "$(AGENT_TASK)" \
	    --input $(AGENT_DEMO_DIR)/input --output $(AGENT_DEMO_DIR)/output \
	    --rootfs $(AGENT_ROOTFS) $(if $(AGENT_POLICY),--policy $(AGENT_POLICY)) --pool-size $(AGENT_POOL_SIZE) \
	    --step-timeout $(AGENT_STEP_TIMEOUT) --session-dir $(AGENT_DEMO_DIR)/sessions
	@echo "demo-agent: the files are in $(AGENT_DEMO_DIR)/output; the trace and summary in $(AGENT_DEMO_DIR)/sessions/*/"
	@ls -l $(AGENT_DEMO_DIR)/output
