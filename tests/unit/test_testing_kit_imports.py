"""The testing kit is a library: ``import scorekit.testing`` must work where Hypothesis is not installed.

A user who only drives fake servers by hand (no property tests) should not need Hypothesis, and one who
touches the strategies without it should be told what to install, not shown a bare ModuleNotFoundError
from deep inside the kit. The check runs in a fresh interpreter whose import system refuses
``hypothesis``, since this one already has it loaded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import scorekit.testing

WITHOUT_HYPOTHESIS = textwrap.dedent(
    """
    import importlib.abc
    import sys


    class NoHypothesis(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hypothesis" or name.startswith("hypothesis."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, NoHypothesis())

    import scorekit.testing as kit
    from scorekit.testing import *  # noqa: F403 (every public name, without Hypothesis)

    scenario = Scenario(ClientScript(chunks=(b"ab", b"cd")), AppBehaviour("eager"))
    outcome = play_scenario(scenario, flavor="hypercorn")
    print("read", outcome.observation().body, "returned", outcome.returned)
    print("loaded", "hypothesis" in sys.modules)
    for touch in (lambda: kit.strategies, lambda: __import__("scorekit.testing.strategies")):
        try:
            touch()
        except ImportError as exc:
            print("refused", exc)
        else:
            print("imported")
    """
)


def test_kit_imports_and_plays_without_hypothesis() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_HYPOTHESIS], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    refusal = "refused scorekit.testing.strategies needs Hypothesis, which is not installed: pip install hypothesis"
    assert result.stdout.splitlines() == ["read b'abcd' returned True", "loaded False", refusal, refusal]


def test_strategies_load_on_first_use_where_hypothesis_is_installed() -> None:
    from hypothesis import strategies as st

    assert isinstance(scorekit.testing.strategies.client_scripts(), st.SearchStrategy)


def test_every_public_name_resolves() -> None:
    missing = [name for name in scorekit.testing.__all__ if not hasattr(scorekit.testing, name)]
    assert missing == []
    assert "strategies" not in scorekit.testing.__all__  # a star import must not need Hypothesis
