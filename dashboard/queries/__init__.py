"""One query module per dashboard page, over `dashboard.source.DataSource` and the catalog."""
