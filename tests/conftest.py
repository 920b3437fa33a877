"""Test-suite settings: no Hypothesis deadlines.

CI machines are shared and slow at times; a wall-clock deadline per example would make
property tests fail for reasons unrelated to the code (the project's rule: speed is a
benchmark, never a timed test). Every failure still prints the reproducing example.
"""

from hypothesis import settings

settings.register_profile("schedlab", deadline=None, print_blob=True)
settings.load_profile("schedlab")
