"""What the gateway shows about itself: Prometheus metrics and the status snapshot."""
