"""Support for the test suite that has to live in the package: fault injection (faults.py)."""
