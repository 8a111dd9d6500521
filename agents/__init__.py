"""The Fleetwatch node agent: plain Python, no Django (tests/test_layering.py)."""
