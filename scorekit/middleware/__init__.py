"""Cross-cutting HTTP concerns, one small ASGI middleware per module, between the lifecycle and the router.

``create_app`` stacks them from a list, outermost first, as Starlette does, under CORS (``cors.JsonCORS``:
Starlette's CORSMiddleware, its refusals in the JSON shape; with ``Settings.allowed_origins``) and the API-key
gate (``Settings.api_keys``), so a preflight and a refused request are answered before the caller's middleware
and the router. ``access.access_line`` writes scorekit's access line from what ``RequestMetrics`` saw::

    LifecycleMiddleware → InFlight → RequestMetrics → CORS → Usage → ApiKeyGate → create_app(middleware=[...])
      → DrainGate → Router

``usage.Usage`` opens each request's ticket (``scorekit.ticket``) and writes what it cost into the answer's head;
``quota.py`` holds the per-key quotas the key gate and the engine take from.

``InFlight`` and ``DrainGate`` are the two layers of one :class:`~scorekit.middleware.drain.Drain`. None of them
reads the server's ``receive`` (the lifecycle middleware above them is its only reader), and none imports the
endpoints (``scorekit.api``) or torch.
"""
