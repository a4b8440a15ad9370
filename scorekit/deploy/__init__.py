"""Running scorekit past one machine, on Ray Serve (``pip install 'scorekit[ray]'``).

:mod:`scorekit.deploy.options` sizes a deployment from the engine's limits and imports no Ray, so the CLI
can check its flags without it; :mod:`scorekit.deploy.replica` is the app each replica runs, with its own
probe port; :mod:`scorekit.deploy.probes` serves that port; :mod:`scorekit.deploy.ray` is the only module
that imports Ray. See docs/deployment.md.
"""
