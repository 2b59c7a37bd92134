"""Serving under load: an OpenAI-compatible server (started by evaluate, or
already running) driven by load profiles, measured per level with the metric
names of `vllm bench serve`, judged against SLOs.

    requests.py   RequestResult / LevelRun: what the client measured (the contract
                  between the load generator and the metrics)
    client.py     the streaming OpenAI client (token-id prompts, usage counts)
    load.py       Level (one load setting) and the load generator that runs one level
    profiles.py   load profiles, the `load=` group: LoadProfile and its subclasses
                  (synchronous, concurrency, rate, sweep, slo_search), named by `_target_`
    metrics.py    LevelRun -> one serving row's metrics (vllm bench serve keys)
    slo.py        SLO checks, goodput and the slo_search algorithm
    run.py        a load profile over a scenario set in one started engine -> serving rows
"""
