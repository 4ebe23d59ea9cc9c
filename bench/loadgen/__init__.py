"""A load generator for Vigil's distributed mode (issue 16): N simulated ranks of one or
more synchronous training jobs ship steps, collective aggregates and heartbeats over the
real ingest contract while faults are injected on a schedule; it reports per interval what
was offered, acknowledged and stored, ingest latency, 429s, drops, CPU per component and
database growth, and at the end whether each fault was found with the right ranks in time.

- ``job``: the simulated job (pure: times in, events out);
- ``faults``: the fault schedule and its detection bounds;
- ``options``: what a run is asked to do, checked up front;
- ``generator``: the ranks as collector-like senders, the run's phases;
- ``http``: the senders' lean keep-alive HTTP/1.1 client (asyncio + h11);
- ``probes``: CPU from ``/proc``, PostgreSQL size and rows, incidents over REST;
- ``report``: counters, the table, the judgement of incidents, the summary's parts.

``python -m bench.loadgen --help`` for the command; ``bench/README.md`` for what it measured.
"""
