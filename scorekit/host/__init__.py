"""A model host process: one model's weights, batcher and worker thread(s) in a process of their own
(``--model-host process``), fed token ids by the front end over a socket.

``wire`` is what crosses the boundary, ``channel`` how it is framed, ``process`` the host and ``client`` the
front end's :class:`~scorekit.model_host.ModelHost` that starts and talks to it (docs/architecture.md, "The
model host process").
"""
