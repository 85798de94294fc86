"""The admin API (``/admin/...``): services and queues managed while the gateway runs, and its
OpenAPI description."""
