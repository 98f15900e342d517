"""Guest-side VM scenarios: every `scenario_*(ctx) -> dict` here runs in one boot per kernel.

See tests/vm/guest_batch.py for the Context API and tests/vm/conftest.py for the host fixtures.
"""
