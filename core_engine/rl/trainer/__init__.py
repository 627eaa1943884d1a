"""Trainer."""
