"""What runs a service, seen from the gateway process: a pool of supervised worker processes
(local or on other hosts), a service in the gateway's own threads, and pipelines of steps."""
