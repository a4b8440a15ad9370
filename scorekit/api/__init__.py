"""The HTTP API: plain async endpoint functions and the route table."""
