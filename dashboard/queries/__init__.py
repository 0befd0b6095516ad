"""One query module per dashboard page, over `collector.query.reader.DataSource` and the catalog."""
