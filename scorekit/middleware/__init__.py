"""Cross-cutting HTTP concerns, one small ASGI middleware per module, between the lifecycle and the router.

``create_app`` stacks them from a list, outermost first, as Starlette does, under CORS (Starlette's
CORSMiddleware, with ``Settings.allowed_origins``) and the API-key gate (``Settings.api_keys``), so a
preflight and a refused request are answered before the caller's middleware and the router::

    LifecycleMiddleware → InFlight → RequestMetrics → CORS → ApiKeyGate → create_app(middleware=[...])
      → DrainGate → Router

``InFlight`` and ``DrainGate`` are the two layers of one :class:`~scorekit.middleware.drain.Drain`. None of them
reads the server's ``receive`` (the lifecycle middleware above them is its only reader), and none imports the
endpoints (``scorekit.api``) or torch.
"""
