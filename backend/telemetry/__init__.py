"""Telemetry: what the ranks report (steps, collectives, …) and the charts read from it.

- ``models``: the append-only tables and the rollup pyramids;
- ``rollups``: rollups kept at ingest, and rebuilt from the records;
- ``timing``: compute time in SQL, the twin of ``detectors.timing.compute_time``;
- ``binning`` and ``queries``: chart data aggregated in SQL;
- ``schemas`` and ``views``: the chart routes under ``/api/v1`` and their response shapes.
"""
