"""Keep the Ray tests' Ray instance on this machine's loopback, and quiet.

Both variables are read when Ray is imported, so they are set here, before any test module imports it.
Ray turns a ``127.0.0.1`` node address into the machine's network address (so other nodes could join);
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (despite its name, on Linux too) makes it keep the loopback one.
No usage statistics are collected or sent.
"""

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
