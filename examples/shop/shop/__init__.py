"""A small shop: orders come in over HTTP, their receipts go out by mail as jobsd jobs."""
