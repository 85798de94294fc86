"""aiohttp plumbing shared by every aiohttp server of the system (the gateway's fronts and a
worker's direct port): the middleware that gives each call a request id and renders every
error one way, and reading a request body within the gateway's limits."""
