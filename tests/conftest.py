import os
import sys

from hypothesis import settings

# The reference twins live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("nbbpe", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("nbbpe")
