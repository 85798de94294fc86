"""I/O-free core shared by the sync and async clients and by the gateway.

Nothing in this package opens a socket, sleeps or reads a clock other than
through arguments, so every decision here is a plain, testable function.
"""
