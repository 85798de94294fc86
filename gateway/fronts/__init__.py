"""The ways in: the lean HTTP front, the aiohttp application's routes, the V2 gRPC server,
the admin API, and Cluster Serving's Redis stream. Each converts its transport's call and
asks the dataplane; none orders the core's steps."""
