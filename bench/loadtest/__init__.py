"""`slotserve loadtest`: drive an OpenAI-compatible endpoint with agent and chat traffic.

Modules, in the order data flows through them:
- `workloads.py`: seeded conversations that build each request from the replies so far;
- `trace.py`: conversations replayed from a JSONL trace;
- `sse.py`: server-sent-events decoding;
- `client.py`: one streamed request, timed (TTFT, inter-token gaps, usage);
- `driver.py`: closed loop (C workers) or open loop (Poisson arrivals, trace offsets);
- `oracle.py`: what a perfect prefix cache would have reused;
- `results.py`: the JSON schema (per-request records and the summary);
- `report.py`: summary statistics, the end-of-run table, `compare`;
- `plots.py`: PNG plots (matplotlib, Agg);
- `cli.py`: `slotserve loadtest run|compare`.
"""
