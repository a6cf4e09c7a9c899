# jail-agent's demo, included by the top Makefile (`include agent/agent.mk`).
# It runs the EDA-and-presentation task on examples/titanic.csv against the
# model endpoint in LLM_BASE_URL / LLM_MODEL (/ LLM_API_KEY); see agent/README.md.
CARGO ?= cargo
AGENT_DEMO_DIR ?= target/demo-agent
AGENT_TASK ?= Do an exploratory data analysis of the Titanic passenger list in titanic.csv and prepare a presentation of the main findings. Deliver a summary table as summary.csv, charts as PNG files, and a slide deck as presentation.pptx.
# The data rootfs (numpy, pandas, matplotlib, python-pptx) when it is built;
# the minimal one (standard library only: no charts, no .pptx) otherwise.
AGENT_DATA_ROOTFS ?= python-rootfs/out/data
AGENT_ROOTFS ?= $(if $(wildcard $(AGENT_DATA_ROOTFS)/usr/bin/python3),$(AGENT_DATA_ROOTFS),python-rootfs/out/minimal)

.PHONY: demo-agent
demo-agent: ## run jail-agent on examples/titanic.csv: summary CSV, charts, .pptx (needs LLM_BASE_URL, LLM_MODEL)
	@if [ -z "$$LLM_BASE_URL" ] || [ -z "$$LLM_MODEL" ]; then \
	    echo "demo-agent: set LLM_BASE_URL and LLM_MODEL to an OpenAI-compatible endpoint with tool calling,"; \
	    echo "            e.g. LLM_BASE_URL=http://localhost:11434/v1 LLM_MODEL=qwen2.5:14b make demo-agent (see agent/README.md)"; \
	    exit 2; \
	fi
	@[ -x "$(AGENT_ROOTFS)/usr/bin/python3" ] || { echo "demo-agent: no rootfs at $(AGENT_ROOTFS): run make rootfs"; exit 2; }
	@case "$(AGENT_ROOTFS)" in *minimal) echo "demo-agent: note: the data rootfs is not built; on the minimal rootfs there is no matplotlib or python-pptx, so expect tables and text instead of charts and a deck";; esac
	$(CARGO) build --release -p jail -p agent
	rm -rf $(AGENT_DEMO_DIR)
	mkdir -p $(AGENT_DEMO_DIR)/input $(AGENT_DEMO_DIR)/sessions
	cp examples/titanic.csv $(AGENT_DEMO_DIR)/input/
	target/release/jail-agent run --task "$(AGENT_TASK)" \
	    --input $(AGENT_DEMO_DIR)/input --output $(AGENT_DEMO_DIR)/output \
	    --rootfs $(AGENT_ROOTFS) --session-dir $(AGENT_DEMO_DIR)/sessions
	@echo "demo-agent: the files are in $(AGENT_DEMO_DIR)/output; the trace and summary in $(AGENT_DEMO_DIR)/sessions/*/"
	@ls -l $(AGENT_DEMO_DIR)/output
