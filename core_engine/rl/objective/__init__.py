"""Objective."""
