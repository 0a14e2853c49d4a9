"""Imports every policy module so that each registers itself."""
