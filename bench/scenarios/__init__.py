"""One module per measured ratio; each takes a :class:`bench.context.Context` and returns a dict."""
