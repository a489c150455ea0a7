"""Measurement: `tandem bench` (serve, measure in turns, report) and `tandem compare` (is the
candidate faster on the same work?), over runs of scripts/speculative-benchmark.py.

    bench.py       the `tandem bench` command: flags, one pair or the sweep  (add_arguments, run)
    plan.py        what runs, checked before any server loads: configurations (Variant), models,
                   client, prompts, the out dir and command.txt (Plan, make_plan)
    servers.py     `tandem serve` / llama-server subprocesses, their command lines, the client
                   runs in ABBA turns and the merge of their per-pass files
    ranking.py     the sweep's ranking of configurations against one baseline, text and Markdown
    compare.py     the `tandem compare` command: equal-work check, spreads, speed-ups, report
                   (add_arguments, run), and the figures bench reports with
    sidebyside.py  llama.cpp side by side (--llama-server), from compare's figures
    agent.py       `tandem bench --agent`: coding tasks (bench/agent_tasks) done end to end by
                   real agent clients (aider, openai-agents) run from their own environments,
                   every configuration in turns
    recorder.py    the recording proxy between an agent and a server (standard library only):
                   per request its first-token delay, tokens, tool calls and timings
    agentreport.py the agent report: success, wall time, speed-ups, first-token delays, drafts,
                   transcripts with and without speculation

The benchmark client itself is scripts/speculative-benchmark.py, standard library only, so that
it runs against llama-server or Tandem without installing Tandem; the openai-agents driver is
scripts/openai-agents-runner.py, run with the agent's own Python.
"""
