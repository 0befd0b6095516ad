"""tailtrace's collector: OTLP/HTTP receiver -> processor -> DuckDB store -> SQL API and export.

Never imports vLLM. Sub-packages: receiver, processor, store, query, export (and scrape, by
another part). `collector.testing.start_collector` starts a real collector for tests.
"""

__all__: list[str] = []
