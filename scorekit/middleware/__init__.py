"""Cross-cutting HTTP concerns, one small ASGI middleware per module, between the lifecycle and the router.

``create_app`` stacks them from a list, outermost first, as Starlette does::

    LifecycleMiddleware → InFlight → RequestMetrics → create_app(middleware=[...]) → DrainGate → Router

None of them reads the server's ``receive``: the lifecycle middleware above them is its only reader.
"""
