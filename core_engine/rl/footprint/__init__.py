"""Footprint."""
