"""Services managed while the gateway runs: the manager, its store and the admin API."""
