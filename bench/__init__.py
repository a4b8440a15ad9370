"""scorekit's benchmark harness: ratios measured against real servers over loopback HTTP.

Every figure it reports is a ratio of two things measured in the same run on the same inputs, so a
shared, noisy machine changes the absolute numbers but not the conclusions. ``python -m bench``
runs everything; ``python -m bench --smoke`` runs each scenario at toy sizes in a few seconds.
"""
